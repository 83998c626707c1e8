// The floor for `make bench`'s abort-to-first-call figure: the least any controller must do on
// this control plane between a saga's abort and its first compensation call, in Go (HTTP/2, one
// connection, like client-go), so the client is not the bottleneck. It watches the namespace's
// Sagas; on an abort it lists the saga's entries with a consistent LIST (the proof that none is
// missing), then calls the participant newest entry first while it writes Compensating, writes
// each entry Compensated after its call, and ends with the saga's Compensated status and its
// phase label: the writes UndoLog makes, without its checks, its Events or its bookkeeping.
// Prints "watching" once its watch is open. No dependencies.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"sync"
	"time"

	"undolog.io/bench/goclients/apiserver"
)

type saga struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Outcome string `json:"outcome"`
	} `json:"spec"`
}

type entry struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		UndoID        string          `json:"undoId"`
		StackPosition int             `json:"stackPosition"`
		Step          string          `json:"step"`
		Compensation  json.RawMessage `json:"compensation"`
	} `json:"spec"`
}

type floor struct {
	api, participant *http.Client
	base, namespace  string // base: .../apis/undolog.io/v1beta1/namespaces/<namespace>
	entries          string // .../v1beta2/namespaces/<namespace>/undoentries: status written with the object
	target           string // the participant's URL
}

func main() {
	api := apiserver.Register()
	namespace := flag.String("namespace", "", "namespace of the sagas")
	target := flag.String("participant", "", "URL every compensation is POSTed to")
	flag.Parse()

	f := &floor{
		api:         api.Client(0),
		participant: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 100}},
		base:        fmt.Sprintf("%s/apis/undolog.io/v1beta1/namespaces/%s", api.Server(), *namespace),
		entries:     fmt.Sprintf("%s/apis/undolog.io/v1beta2/namespaces/%s/undoentries/", api.Server(), *namespace),
		namespace:   *namespace,
		target:      *target,
	}
	f.watch()
}

// watch follows the namespace's Sagas from now on and compensates each one aborted, once.
func (f *floor) watch() {
	var listed struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	for { // the apiserver answers 429 while its storage for a new CRD initializes
		answer, err := f.api.Get(f.base + "/sagas?limit=1")
		apiserver.Check(err)
		apiserver.Check(json.NewDecoder(answer.Body).Decode(&listed))
		answer.Body.Close()
		if answer.StatusCode == http.StatusOK {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	answer, err := f.api.Get(f.base + "/sagas?watch=1&resourceVersion=" + listed.Metadata.ResourceVersion)
	apiserver.Check(err)
	if answer.StatusCode != http.StatusOK {
		apiserver.Check(fmt.Errorf("watch: HTTP %d", answer.StatusCode))
	}
	fmt.Println("watching")
	handled := map[string]bool{}
	lines := bufio.NewScanner(answer.Body)
	lines.Buffer(make([]byte, 1<<20), 1<<21)
	for lines.Scan() {
		var event struct {
			Object saga `json:"object"`
		}
		apiserver.Check(json.Unmarshal(lines.Bytes(), &event))
		name := event.Object.Metadata.Name
		if event.Object.Spec.Outcome == "Abort" && !handled[name] {
			handled[name] = true
			go f.compensate(name)
		}
	}
	apiserver.Check(fmt.Errorf("watch ended: %v", lines.Err()))
}

func (f *floor) compensate(name string) {
	var listed struct {
		Items []entry `json:"items"`
	}
	f.request(http.MethodGet, "/undoentries?fieldSelector="+url.QueryEscape("spec.saga="+name), nil, &listed)
	entries := listed.Items
	sort.Slice(entries, func(i, j int) bool { return entries[i].Spec.StackPosition > entries[j].Spec.StackPosition })
	var writing sync.WaitGroup
	writing.Add(1)
	go func() {
		defer writing.Done()
		f.patch("/sagas/"+name+"/status", `{"status":{"phase":"Compensating"}}`)
	}()
	for _, e := range entries {
		f.call(name, e)
		f.send(http.MethodPatch, f.entries+e.Metadata.Name, []byte(`{"metadata":{"managedFields":[{}]},"status":{"state":"Compensated"}}`), nil)
	}
	writing.Wait()
	f.patch("/sagas/"+name+"/status", `{"status":{"phase":"Compensated"}}`)
	f.patch("/sagas/"+name, `{"metadata":{"labels":{"undolog.io/phase":"Compensated"}}}`)
}

func (f *floor) call(saga string, e entry) {
	var compensation struct {
		Args json.RawMessage `json:"args"`
	}
	apiserver.Check(json.Unmarshal(e.Spec.Compensation, &compensation))
	request, err := http.NewRequest(http.MethodPost, f.target, bytes.NewReader(compensation.Args))
	apiserver.Check(err)
	request.Header.Set("Content-Type", "application/json")
	request.Header.Set("Idempotency-Key", e.Spec.UndoID)
	request.Header.Set("Undolog-Saga", f.namespace+"/"+saga)
	request.Header.Set("Undolog-Step", e.Spec.Step)
	request.Header.Set("Undolog-Attempt", "1")
	answer, err := f.participant.Do(request)
	apiserver.Check(err)
	_, _ = io.Copy(io.Discard, answer.Body)
	answer.Body.Close()
}

func (f *floor) patch(path, body string) {
	f.request(http.MethodPatch, path, []byte(body), nil)
}

// request sends one API request on the namespace's v1beta1 path and decodes its answer into `into` (nil: discarded).
func (f *floor) request(method, path string, body []byte, into any) {
	f.send(method, f.base+path, body, into)
}

func (f *floor) send(method, path string, body []byte, into any) {
	request, err := http.NewRequest(method, path, bytes.NewReader(body))
	apiserver.Check(err)
	if body != nil {
		request.Header.Set("Content-Type", "application/merge-patch+json")
	}
	answer, err := f.api.Do(request)
	apiserver.Check(err)
	defer answer.Body.Close()
	if answer.StatusCode != http.StatusOK {
		text, _ := io.ReadAll(answer.Body)
		apiserver.Check(fmt.Errorf("%s %s: HTTP %d: %s", method, path, answer.StatusCode, text))
	}
	if into != nil {
		apiserver.Check(json.NewDecoder(answer.Body).Decode(into))
	} else {
		_, _ = io.Copy(io.Discard, answer.Body)
	}
}
