// The raw API ceiling for `make bench`: JSON merge patches of UndoEntry status made by a plain Go
// client (HTTP/2, one connection, like client-go) at a given concurrency, so the operator's own
// write rate can be compared with what the apiserver serves in the same run. No dependencies.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"undolog.io/bench/goclients/apiserver"
)

func main() {
	api := apiserver.Register()
	namespace := flag.String("namespace", "", "namespace of the entries")
	names := flag.String("names", "", "comma-separated UndoEntry names to patch, round robin")
	writes := flag.Int("writes", 1000, "how many patches in all")
	concurrency := flag.Int("concurrency", 10, "patches in flight at once")
	flag.Parse()

	client := api.Client(*concurrency)
	client.Timeout = 30 * time.Second
	entries := strings.Split(*names, ",")
	var next, failed atomic.Int64
	var wait sync.WaitGroup
	began := time.Now()
	for w := 0; w < *concurrency; w++ {
		wait.Add(1)
		go func() {
			defer wait.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(*writes) {
					return
				}
				// v1beta2: the status written with the object, as the operator writes it
				url := fmt.Sprintf("%s/apis/undolog.io/v1beta2/namespaces/%s/undoentries/%s",
					api.Server(), *namespace, entries[i%int64(len(entries))])
				body := []byte(fmt.Sprintf(`{"metadata":{"managedFields":[{}]},"status":{"retryCount":%d}}`, i))
				request, err := http.NewRequest(http.MethodPatch, url, bytes.NewReader(body))
				apiserver.Check(err)
				request.Header.Set("Content-Type", "application/merge-patch+json")
				answer, err := client.Do(request)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, answer.Body)
				answer.Body.Close()
				if answer.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		}()
	}
	wait.Wait()
	seconds := time.Since(began).Seconds()
	done := int64(*writes) - failed.Load()
	apiserver.Check(json.NewEncoder(os.Stdout).Encode(map[string]any{
		"writes": done, "failed": failed.Load(), "concurrency": *concurrency,
		"seconds": seconds, "writes_per_second": float64(done) / seconds,
	}))
}
