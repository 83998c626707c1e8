// Package apiserver is what bench's Go clients share: the flags that say which apiserver to
// reach and as whom, and an HTTP/2 client for it (one connection, like client-go).
package apiserver

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"os"
)

// Flags are the apiserver's URL and the admin's client certificate.
type Flags struct {
	server, ca, cert, key *string
}

// Register adds --server, --ca, --cert and --key to the command line; call before flag.Parse.
func Register() Flags {
	return Flags{
		server: flag.String("server", "", "apiserver URL, e.g. https://127.0.0.1:6443"),
		ca:     flag.String("ca", "", "CA file that signed the apiserver's certificate"),
		cert:   flag.String("cert", "", "client certificate file"),
		key:    flag.String("key", "", "client key file"),
	}
}

// Server is the apiserver's URL.
func (f Flags) Server() string { return *f.server }

// Client is an HTTP/2 client with the client certificate; `idle` connections are kept.
func (f Flags) Client(idle int) *http.Client {
	pair, err := tls.LoadX509KeyPair(*f.cert, *f.key)
	Check(err)
	pem, err := os.ReadFile(*f.ca)
	Check(err)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: idle,
	}}
}

// Check ends the program on an error: a benchmark client has nothing to retry.
func Check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
