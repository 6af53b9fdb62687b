package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDecisionsFollowPrintsEachDecisionAsItIsLogged: --follow asks the API
// server for the log with follow=true and prints each decision as the stream
// delivers it, before the log ends; --since goes to the API server as
// sinceTime. (A stand-in for pods/log, as apiServerWithPodLogs says why.)
func TestDecisionsFollowPrintsEachDecisionAsItIsLogged(t *testing.T) {
	f := newDecisionsFixture(t)
	lines := strings.Split(strings.TrimSpace(f.kubectlLogs()), "\n")
	more := make(chan struct{})
	var mu sync.Mutex
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const pods = "/api/v1/namespaces/ichor-system/pods"
		switch {
		case r.URL.Path == pods:
			list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: []corev1.Pod{{
				ObjectMeta: metav1.ObjectMeta{Name: "ichor-policy-a", Namespace: "ichor-system"},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager"}}},
			}}}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(list)
		case r.URL.Path == pods+"/ichor-policy-a/log":
			mu.Lock()
			queries = append(queries, r.URL.RawQuery)
			mu.Unlock()
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, strings.Join(lines[:2], "\n")+"\n") // the first decision
			w.(http.Flusher).Flush()
			select {
			case <-more:
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, strings.Join(lines[2:], "\n")+"\n")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	kubeconfig := kubeconfigFor(t, srv.URL, "")

	for _, tc := range []struct {
		name  string
		flags []string
		// first is in the output before the log goes on, want after.
		first, want []string
	}{
		{"table", nil, []string{"ID", f.approve}, []string{f.deny, f.pending, f.two}},
		{"json", []string{"-o", "json", "--action", "deny"}, nil, []string{`"id": "` + f.deny + `"`}},
		{"yaml", []string{"-o", "yaml", "--action", "approve"}, []string{"id: " + f.approve}, []string{"---\n", "id: " + f.two}},
		{"name since", []string{"-o", "name", "--since", "1h"}, []string{"decision.cli.ichor.dev/" + f.approve}, []string{"decision.cli.ichor.dev/" + f.two}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			more = make(chan struct{})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, errOut := &decisionsSink{}, &bytes.Buffer{}
			done := make(chan int)
			go func() {
				done <- Run(ctx, append([]string{"decisions", "list", "--from-cluster", "--follow", "--kubeconfig", kubeconfig}, tc.flags...), strings.NewReader(""), out, errOut)
			}()
			stdout := func() string { out.mu.Lock(); defer out.mu.Unlock(); return out.buf.String() }
			for _, w := range tc.first {
				require.Eventually(t, func() bool { return strings.Contains(stdout(), w) }, 30*time.Second, 10*time.Millisecond, "printed before the log goes on: %s", w)
			}
			assert.NotContains(t, stdout(), f.two, "nothing that was not logged yet")
			close(more)
			require.Equal(t, ExitOK, <-done, errOut.String())
			for _, w := range tc.want {
				assert.Contains(t, stdout(), w)
			}
			switch tc.name {
			case "json":
				assert.NotContains(t, stdout(), f.approve, "the filters apply")
			case "table":
				assert.Equal(t, 1, strings.Count(stdout(), "REVISION"), "one header for the rows as they come")
			}
			assert.Contains(t, errOut.String(), "the logs of ichor-policy-a ended")
		})
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, queries, 4)
	assert.Contains(t, queries[0], "follow=true")
	assert.NotContains(t, queries[0], "sinceTime")
	assert.Contains(t, queries[3], "sinceTime=")
}

// A followed log that ends while others go on (its container stopped or
// restarted) is said at once: that replica's decisions stop coming, and
// before, only the end of every log was said (review 255 F7).
func TestDecisionsFollowSaysALogThatEndedAtOnce(t *testing.T) {
	f := newDecisionsFixture(t)
	logs := f.kubectlLogs()
	more := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const pods = "/api/v1/namespaces/ichor-system/pods"
		switch r.URL.Path {
		case pods:
			list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
			for _, name := range []string{"ichor-policy-a", "ichor-policy-b"} {
				list.Items = append(list.Items, corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ichor-system"},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "manager"}}},
				})
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(list)
		case pods + "/ichor-policy-a/log":
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, logs) // and ends
		case pods + "/ichor-policy-b/log":
			w.Header().Set("Content-Type", "text/plain")
			w.(http.Flusher).Flush()
			select {
			case <-more:
			case <-r.Context().Done():
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errOut := &decisionsSink{}, &decisionsSink{}
	done := make(chan int)
	go func() {
		done <- Run(ctx, []string{"decisions", "list", "--from-cluster", "--follow", "--kubeconfig", kubeconfigFor(t, srv.URL, "")}, strings.NewReader(""), out, errOut)
	}()
	stderr := func() string { errOut.mu.Lock(); defer errOut.mu.Unlock(); return errOut.buf.String() }
	require.Eventually(t, func() bool { return strings.Contains(stderr(), "the log of pod ichor-policy-a ended") }, 30*time.Second, 10*time.Millisecond,
		"while pod b's log is still followed: %q", stderr())
	assert.NotContains(t, stderr(), "the logs of", "nothing said of every log's end yet")
	close(more)
	require.Equal(t, ExitOK, <-done, stderr())
	assert.Contains(t, stderr(), "the logs of ichor-policy-a, ichor-policy-b ended")
}

func TestDecisionsFollowUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"decisions", "list", "--follow"}, "give --from-cluster"},
		{[]string{"decisions", "list", "--follow", "--from-cluster", "--previous"}, "contradict"},
		{[]string{"decisions", "list", "--follow", "--from-cluster", "-o", "xml"}, `unable to match a printer suitable for the output format "xml"`},
		// Bounds of a whole read, taken and ignored before (review 202 F6).
		{[]string{"decisions", "list", "--follow", "--from-cluster", "--max-log-entries", "5"}, "--max-log-bytes and --max-log-entries bound a whole read"},
		{[]string{"decisions", "list", "--follow", "--from-cluster", "--max-log-bytes", "1024"}, "--max-log-bytes and --max-log-entries bound a whole read"},
	} {
		code, _, stderr, _ := decisionsRun(t, "", tc.args...)
		assert.Equal(t, ExitUsage, code, stderr)
		assert.Contains(t, stderr, tc.want)
	}
}

// A followed log that breaks off is said at once and fails the following
// when the others end (review 187: it ended in silence, and the command
// said only that the logs ended, exit 0).
func TestDecisionsFollowSaysALogThatBrokeOff(t *testing.T) {
	f := newDecisionsFixture(t)
	logs := f.kubectlLogs()
	lines := strings.SplitAfter(logs, "\n")
	srv, _ := apiServerWithPodLogs(t, map[string]string{
		"ichor-policy-7d9c6b8f5-a": logs,
		// Broken off between two lines.
		"ichor-policy-7d9c6b8f5-b": brokenStream + strings.Join(lines[:len(lines)/2], ""),
		// A decision's line torn, and one past --max-line-bytes: each may
		// be a decision lost, and is said (review 190).
		"ichor-policy-7d9c6b8f5-c": `{"bundles":{"ichor":{"revision":"r"}},"decision_id":"x","input":{"csr":` + "\n" + strings.Repeat("x", 5000) + "\n",
	})
	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", "--from-cluster", "--follow", "--max-line-bytes", "4096", "--kubeconfig", kubeconfigFor(t, srv.URL, ""))
	assert.Equal(t, ExitError, code, stderr)
	assert.Contains(t, stderr, "follow the log of pod ichor-system/ichor-policy-7d9c6b8f5-b, container manager: it broke off")
	assert.Contains(t, stderr, "skipped 1 damaged decision-log entry")
	assert.Contains(t, stderr, "skipped 1 line longer than --max-line-bytes")
	assert.Contains(t, stdout, f.two, "the other pod's decisions, as they came")
}

// A replica whose log cannot be opened for another cause than none to read
// (its kubelet unreachable) is said, the others followed, and the following
// fails when it ends; one still starting is only said (review 204 F5).
func TestDecisionsFollowFailsForALogThatCannotBeOpened(t *testing.T) {
	f := newDecisionsFixture(t)
	for name, tc := range map[string]struct {
		log  string
		code int
	}{
		"kubelet unreachable": {kubeletUnreachable, ExitError},
		"still starting":      {waitingContainer, ExitOK},
	} {
		t.Run(name, func(t *testing.T) {
			srv, _ := apiServerWithPodLogs(t, map[string]string{
				"ichor-policy-7d9c6b8f5-a": f.kubectlLogs(),
				"ichor-policy-7d9c6b8f5-b": tc.log,
			})
			code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", "--from-cluster", "--follow", "--kubeconfig", kubeconfigFor(t, srv.URL, ""))
			assert.Equal(t, tc.code, code, stderr)
			assert.Contains(t, stderr, "ichor: pod ichor-policy-7d9c6b8f5-b skipped: ")
			assert.Contains(t, stdout, f.two, "the other pod's decisions, as they came")
		})
	}
}

// A followed decision the printers cannot hold is named when it comes, and
// the following exits 1 when the logs end (review 257).
func TestDecisionsFollowFailsForADecisionLeftOut(t *testing.T) {
	srv, _ := apiServerWithPodLogs(t, map[string]string{
		"ichor-policy-7d9c6b8f5-a": fmt.Sprintf(unprintableEntry, "good", "1") + fmt.Sprintf(unprintableEntry, "forged", "1e400"),
	})
	code, stdout, stderr, _ := decisionsRun(t, "", "decisions", "list", "--from-cluster", "--follow", "-o", "json", "--kubeconfig", kubeconfigFor(t, srv.URL, ""))
	assert.Equal(t, ExitError, code, stderr)
	assert.Contains(t, stdout, "good")
	assert.NotContains(t, stdout, "forged")
	assert.Contains(t, stderr, "ichor: decision forged left out of the output")
	assert.Contains(t, stderr, "ichor: the logs of ichor-policy-7d9c6b8f5-a ended")
	assert.Contains(t, stderr, "ichor: 1 of 2 decisions left out of the output")
}
