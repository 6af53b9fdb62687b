package decisionlog

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ManagerSelector selects the manager's pods by the chart's selector label
// app.kubernetes.io/name (deploy/chart/templates/_helpers.tpl, with the
// chart's name). The chart's other selector label, app.kubernetes.io/instance,
// is the Helm release's name, which a reader does not know; a second
// release in the same namespace is told apart with another selector.
const ManagerSelector = "app.kubernetes.io/name=ichor-policy"

// ManagerContainer is the name of the manager's container in its pods: its
// standard output is the console decision log.
const ManagerContainer = "manager"

// Cluster reads the decision log from the manager pods' logs, as `kubectl
// logs` would, through the API server.
type Cluster struct {
	Client    kubernetes.Interface
	Namespace string
	// Selector is a label selector; ManagerSelector when empty.
	Selector string
	// Previous reads the logs of the containers' previous instances (before
	// a restart), as kubectl logs --previous.
	Previous bool
	// Unreadable, when set, is told of each pod whose log could not be read
	// (a container still starting in a rolling update, one that never
	// restarted with Previous): the others are read all the same. Follow
	// tells it of a log that broke off too.
	Unreadable func(pod string, err error)
	// Ended, when set, is told at once of each followed log that ended (its
	// container stopped or restarted) while others are still followed:
	// that replica's decisions are no longer shown (review 255 F7: only
	// the end of every log was said).
	Ended func(pod string)
	// Limits bound what is read of each pod's log (see ReadLimited); its
	// MaxEntries bounds the decisions of all of them together.
	Limits Limits
}

// Read reads the decisions in the logs of the container named
// ManagerContainer of every pod selected, and returns them in the order they
// were made (each replica logs the decisions it made; their logs are
// merged by time, a replica's own order kept), with the pods read. No pod
// selected is an error: the namespace or the selector is wrong.
func (c Cluster) Read(ctx context.Context) ([]Entry, Skipped, []string, error) {
	selector := cmp.Or(c.Selector, ManagerSelector)
	pods, err := c.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, Skipped{}, nil, fmt.Errorf("list the manager's pods in namespace %s (%s): %w", c.Namespace, selector, err)
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return cmp.Compare(a.Name, b.Name) })
	var entries []Entry
	var skipped Skipped
	var read []string
	var errs []error
	for _, pod := range pods.Items {
		if !slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ManagerContainer }) {
			continue
		}
		got, s, opened, err := c.readPod(ctx, pod.Name, c.Limits.After(len(entries)))
		if err != nil && (opened || errors.Is(err, ErrTooLarge) || !podWithoutLog(err)) {
			// Not a pod to skip: what is listed (and replayed, and gated
			// on) would lack its decisions. Only a pod without a log to
			// read (a container still starting, no previous one, the pod
			// gone) is skipped; a log that breaks off while read (a
			// connection reset, the API server's timeout: review 187) or
			// that cannot be opened otherwise (the pod's kubelet
			// unreachable, throttled, forbidden: review 202 F3) was
			// skipped alike before, and a replay's gate passed on the
			// other replicas' decisions alone.
			return nil, Skipped{}, nil, err
		}
		if err != nil {
			errs = append(errs, err)
			if c.Unreadable != nil {
				c.Unreadable(pod.Name, err)
			}
			continue
		}
		entries = append(entries, got...)
		skipped.Add(s)
		read = append(read, pod.Name)
	}
	if len(read) == 0 && len(errs) > 0 {
		return nil, Skipped{}, nil, errors.Join(errs...)
	}
	if len(read) == 0 {
		return nil, Skipped{}, nil, fmt.Errorf("no pod in namespace %s matches %s with a container named %s: give the manager's namespace (-n) or its pods' labels (--selector)", c.Namespace, selector, ManagerContainer)
	}
	slices.SortStableFunc(entries, func(a, b Entry) int { return a.Timestamp.Compare(b.Timestamp) })
	return entries, skipped, read, nil
}

// podWithoutLog is whether a log that could not be opened is one the pod
// does not have: the API server answers 400 for a container still starting
// and, with Previous, for one that never restarted, and 404 for a pod gone
// since it was listed.
func podWithoutLog(err error) bool {
	return apierrors.IsBadRequest(err) || apierrors.IsNotFound(err)
}

// readPod reads a pod's log, and reports whether it was opened: an error
// after that is the log broken off, not a pod without one.
func (c Cluster) readPod(ctx context.Context, name string, limits Limits) ([]Entry, Skipped, bool, error) {
	stream, err := c.Client.CoreV1().Pods(c.Namespace).GetLogs(name, &corev1.PodLogOptions{Container: ManagerContainer, Previous: c.Previous}).Stream(ctx)
	if err != nil {
		return nil, Skipped{}, false, fmt.Errorf("read the log of pod %s/%s, container %s: %w", c.Namespace, name, ManagerContainer, err)
	}
	defer stream.Close()
	entries, skipped, err := ReadLimited(stream, limits)
	if err != nil {
		return nil, Skipped{}, true, fmt.Errorf("read the log of pod %s/%s, container %s: %w", c.Namespace, name, ManagerContainer, err)
	}
	return entries, skipped, true, nil
}

// Follow streams the decisions of the log of every selected pod's manager
// container as they are written, as kubectl logs -f does: from since (nil:
// the whole log), each entry passed to found with its pod, one at a time.
// Nothing is held: each line is read within Limits.MaxLine and dropped. It
// returns the pods followed when every stream has ended (a pod gone) or ctx
// is done. Pods that start after it began are not followed (kubectl logs -f
// follows those it found too).
func (c Cluster) Follow(ctx context.Context, since *metav1.Time, found func(pod string, e Entry) error) ([]string, Skipped, error) {
	selector := cmp.Or(c.Selector, ManagerSelector)
	pods, err := c.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, Skipped{}, fmt.Errorf("list the manager's pods in namespace %s (%s): %w", c.Namespace, selector, err)
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return cmp.Compare(a.Name, b.Name) })
	limits := c.Limits.withDefaults()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var followed []string
	var errs []error
	// foundErr is found's first error: it ends the following.
	var foundErr error
	// broken are the streams that broke off.
	var broken []error
	// skipped counts what may have held a decision and was not read: lines
	// longer than the bound, and entries cut short (other logs' lines are
	// not counted: they are most of what a log holds).
	var skipped Skipped
	hasManager := func(pod corev1.Pod) bool {
		return slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ManagerContainer })
	}
	// following counts the logs still followed, or still to be opened: a
	// log that ends before the next is opened is not the last.
	following := 0
	for _, pod := range pods.Items {
		if hasManager(pod) {
			following++
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, pod := range pods.Items {
		if !hasManager(pod) {
			continue
		}
		stream, err := c.Client.CoreV1().Pods(c.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{
			Container: ManagerContainer, Follow: true, SinceTime: since,
		}).Stream(ctx)
		if err != nil {
			err = fmt.Errorf("follow the log of pod %s/%s, container %s: %w", c.Namespace, pod.Name, ManagerContainer, err)
			errs = append(errs, err)
			// Under the lock: the streams opened before this one may be
			// telling of theirs meanwhile (review 190).
			mu.Lock()
			following--
			if c.Unreadable != nil {
				c.Unreadable(pod.Name, err)
			}
			if !podWithoutLog(err) && ctx.Err() == nil {
				// A replica whose log has decisions that are not shown
				// fails the following when it ends, as a log that breaks
				// off does; the others are followed meanwhile (review
				// 204 F5).
				broken = append(broken, err)
			}
			mu.Unlock()
			continue
		}
		followed = append(followed, pod.Name)
		wg.Add(1)
		go func(name string, stream io.ReadCloser) {
			defer wg.Done()
			defer stream.Close()
			br := bufio.NewReader(stream)
			var text []byte
			for {
				var long bool
				var err error
				text, long, err = nextLine(br, text[:0], limits.MaxLine)
				if long {
					mu.Lock()
					skipped.Long++
					mu.Unlock()
				} else if t := bytes.TrimSpace(text); len(t) > 0 {
					var entries []Entry
					var lines Skipped
					if !readLine(&entries, &lines, t) && damaged(t) {
						// Counted as Read counts them: a decision
						// may be lost in each (review 190).
						lines.Damaged++
					}
					mu.Lock()
					skipped.Add(Skipped{Long: lines.Long, Damaged: lines.Damaged})
					for _, e := range entries {
						if foundErr == nil {
							if foundErr = found(name, e); foundErr != nil {
								cancel()
							}
						}
					}
					mu.Unlock()
				}
				if err != nil {
					// Under the lock, as found: two streams may end or
					// break at once (review 188).
					mu.Lock()
					following--
					switch {
					case ctx.Err() != nil:
					case errors.Is(err, io.EOF):
						// Its container stopped: said at once while
						// others are followed, the last with them.
						if c.Ended != nil && following > 0 {
							c.Ended(name)
						}
					default:
						// A stream broken off (not a pod gone, nor
						// the following stopped) is said at once and
						// fails the following when it ends: its
						// decisions stop coming while the others'
						// still do (review 187: it ended in silence,
						// and the command said only that the logs
						// ended).
						err = fmt.Errorf("follow the log of pod %s/%s, container %s: it broke off: %w", c.Namespace, name, ManagerContainer, err)
						if c.Unreadable != nil {
							c.Unreadable(name, err)
						}
						broken = append(broken, err)
					}
					mu.Unlock()
					return
				}
			}
		}(pod.Name, stream)
	}
	if len(followed) == 0 {
		if len(errs) > 0 {
			return nil, Skipped{}, errors.Join(errs...)
		}
		return nil, Skipped{}, fmt.Errorf("no pod in namespace %s matches %s with a container named %s: give the manager's namespace (-n) or its pods' labels (--selector)", c.Namespace, selector, ManagerContainer)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if foundErr != nil {
		return followed, skipped, foundErr
	}
	return followed, skipped, errors.Join(broken...)
}
