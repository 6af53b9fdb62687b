package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/ichor-policy/engine"
	"github.com/ichor-dev/ichor-policy/internal/decisionlog"
	"github.com/ichor-dev/ichor-policy/internal/kube"
	"github.com/ichor-dev/ichor-policy/internal/termsafe"
	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// ExitChanged is the exit status of "decisions replay" when a logged
// decision would change in a direction given to --fail-on: the report was
// printed, and the candidate bundle should not ship as it is.
const ExitChanged = 3

// exitError asks for an exit status other than ExitError.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// ExitCode is the process exit status the error asks for.
func (e exitError) ExitCode() int { return e.code }

const decisionsInput = `FILE is a decision log: the manager's standard output, one JSON object a line,
as OPA's console decision log writes it; "-" or no FILE reads standard input,
so "kubectl logs deploy/ichor-policy | ichor decisions ..." works. Lines that
are not decision-log entries (the controllers' and OPA's own logs, which
kubectl logs interleaves) are skipped, and their number is noted on standard
error. What a decision-log service stores (--decision-log-url) is read too:
OPA's decision-log events, one a line or in JSON arrays (an upload's body),
and any of these gzip-compressed (as uploads are), detected from the content.
An input in which no decision is read is an error (exit 1). Each input is read
up to --max-log-bytes once decompressed (a longer one is refused, exit 1), and
a line longer than --max-line-bytes is skipped unread and counted.

--from-cluster reads the manager pods' logs through the API server instead
(the container named manager of each pod --selector selects, in -n, by
default ichor-system, never the kubeconfig context's namespace, which may be
a tenant's), so no kubectl logs pipe is needed; you need list on pods and get
on pods/log there.`

func newDecisionsCommand(s streams) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "decisions",
		Short: "Read the decision log: list, show and replay decisions",
		Long: `Read the decision log the manager writes: list the decisions, show one whole,
or replay them against a candidate bundle to see what a policy change would
change on real traffic.

` + decisionsInput,
	}
	cmd.AddCommand(newDecisionsListCommand(s), newDecisionsShowCommand(s), newDecisionsReplayCommand(s))
	return cmd
}

// filterFlags are the flags that select decisions, shared by list and replay.
type filterFlags struct {
	policy, action, node, user, since, revision string
}

func (f *filterFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	// Every short name, from the table the filter reads (review 187: the
	// help named six of ten).
	fs.StringVar(&f.policy, "policy", "", "only decisions of this rule: "+strings.Join(slices.Sorted(maps.Keys(decisionlog.Policies)), ", ")+", or a decision path such as ichor/kubelet_serving/decision")
	fs.StringVar(&f.action, "action", "", "only decisions with this action: "+strings.Join(decisionlog.Actions, ", ")+" (allowed and refused are admission's and issuance's)")
	fs.StringVar(&f.node, "node", "", "only decisions about this node (the result's node, the request's system:node:NAME, or the Nodename Talos reported)")
	fs.StringVar(&f.user, "user", "", "only decisions on a request by this user (the CSR's spec.username, or the admission request's user)")
	fs.StringVar(&f.since, "since", "", "only decisions made since then: a duration before now (30m, 24h, 30d, 1d12h) or an RFC 3339 time")
	fs.StringVar(&f.revision, "revision", "", "only decisions made with this bundle revision (or a prefix of it)")
}

// criteria validates the flags; every error is a usage error.
func (f filterFlags) criteria(now time.Time) (decisionlog.Criteria, error) {
	c := decisionlog.Criteria{Action: f.action, Node: f.node, User: f.user, Revision: f.revision}
	if f.policy != "" {
		path, err := decisionlog.ResolvePolicy(f.policy)
		if err != nil {
			return c, usage.Errorf("--policy: %v", err)
		}
		c.Path = path
	}
	if f.action != "" && !decisionlog.ValidAction(f.action) {
		return c, usage.Errorf("--action %q is not an action: give one of %s", f.action, strings.Join(decisionlog.Actions, ", "))
	}
	if f.since != "" {
		since, err := decisionlog.ParseSince(f.since, now)
		if err != nil {
			return c, usage.Errorf("--since: %v", err)
		}
		c.Since = since
	}
	return c, nil
}

// sourceFlags say where the decision log is read from besides files: the
// manager pods' logs, through the API server.
type sourceFlags struct {
	fromCluster                              bool
	kubeconfig, context, namespace, selector string
	previous                                 bool
	// maxBytes and maxLine bound what is read of each input (each pod's
	// log with --from-cluster): decisionlog.Limits.
	maxBytes   int64
	maxLine    int
	maxEntries int
}

// defaultNamespace is where the chart is installed by the documented
// command, for a kubeconfig context that names no namespace.
const defaultNamespace = "ichor-system"

func (f *sourceFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.BoolVar(&f.fromCluster, "from-cluster", false, "read the manager pods' logs through the API server (container "+decisionlog.ManagerContainer+" of the pods --selector selects), instead of FILE")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "with --from-cluster: the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&f.context, "context", "", "with --from-cluster: the kubeconfig context to use")
	fs.StringVarP(&f.namespace, "namespace", "n", "", "with --from-cluster: the manager's namespace (default "+defaultNamespace+", whatever the context's)")
	fs.StringVar(&f.selector, "selector", decisionlog.ManagerSelector, "with --from-cluster: the label selector of the manager's pods (the chart's)")
	fs.BoolVar(&f.previous, "previous", false, "with --from-cluster: read the containers' logs before their last restart, as kubectl logs --previous")
	fs.Int64Var(&f.maxBytes, "max-log-bytes", decisionlog.DefaultMaxBytes, "the most bytes read of each log (each pod's with --from-cluster), after decompression: a longer log is refused")
	fs.IntVar(&f.maxLine, "max-line-bytes", decisionlog.DefaultMaxLine, "the most bytes of one line: a longer line is skipped, and counted")
	fs.IntVar(&f.maxEntries, "max-log-entries", decisionlog.DefaultMaxEntries, "the most decisions read of all the logs together (every pod's with --from-cluster): the log that takes them past it is refused")
}

// The highest --max-log-bytes and --max-line-bytes: far above any log's
// (the defaults are 1 GiB and 16 MiB), far below what overflows.
const (
	maxLogBytesFlag  = 1 << 40
	maxLineBytesFlag = 1 << 30
)

// limits validates --max-log-bytes, --max-line-bytes and --max-log-entries.
func (f sourceFlags) limits() (decisionlog.Limits, error) {
	// Bounded above too: the reader counts one byte past each bound, and
	// twice a line's for a JSON document's item, which the largest numbers
	// overflow (review 187: a panic, and every document refused).
	if f.maxBytes <= 0 || f.maxBytes > maxLogBytesFlag {
		return decisionlog.Limits{}, usage.Errorf("--max-log-bytes %d: give a number of bytes above 0 and at most %d (1 TiB)", f.maxBytes, int64(maxLogBytesFlag))
	}
	if f.maxLine <= 0 || f.maxLine > maxLineBytesFlag {
		return decisionlog.Limits{}, usage.Errorf("--max-line-bytes %d: give a number of bytes above 0 and at most %d (1 GiB)", f.maxLine, maxLineBytesFlag)
	}
	if f.maxEntries <= 0 {
		return decisionlog.Limits{}, usage.Errorf("--max-log-entries %d: give a number of decisions above 0", f.maxEntries)
	}
	return decisionlog.Limits{MaxBytes: f.maxBytes, MaxLine: f.maxLine, MaxEntries: f.maxEntries}, nil
}

// tooLarge says which flag raises the bound a log exceeded. It stays an
// error of the input (exit 1), not of the command line.
func tooLarge(err error) error {
	if errors.Is(err, decisionlog.ErrTooLarge) {
		flag := "--max-log-bytes"
		if errors.Is(err, decisionlog.ErrTooManyDecisions) {
			flag = "--max-log-entries"
		}
		return fmt.Errorf("%w (%s raises the bound)", err, flag)
	}
	return err
}

// readDecisions reads the decision log: the manager pods' logs with
// --from-cluster, else the files, in order; no file, or "-", is standard
// input. Reading no decision at all is an error: a listing, a search or a
// replay of nothing would report success on, say, the wrong container's log
// or a service's store in a shape not read.
func readDecisions(cmd *cobra.Command, s streams, src sourceFlags, files []string) ([]decisionlog.Entry, error) {
	limits, err := src.limits()
	if err != nil {
		return nil, err
	}
	if src.fromCluster {
		if len(files) > 0 {
			return nil, usage.Errorf("--from-cluster reads the manager pods' logs: give no FILE (%s)", strings.Join(files, " "))
		}
		return readCluster(cmd.Context(), s, src, limits)
	}
	for _, name := range []string{"kubeconfig", "context", "namespace", "selector", "previous"} {
		if cmd.Flags().Changed(name) {
			return nil, usage.Errorf("--%s is for --from-cluster", name)
		}
	}
	if len(files) == 0 {
		files = []string{"-"}
	}
	if n := slices.Index(files, "-"); n >= 0 && slices.Index(files[n+1:], "-") >= 0 {
		return nil, usage.Errorf(`"-" (standard input) is given twice`)
	}
	var all []decisionlog.Entry
	var skipped decisionlog.Skipped
	for _, name := range files {
		entries, n, err := readDecisionFile(s.in, name, limits.After(len(all)))
		if err != nil {
			return nil, err
		}
		all = append(all, entries...)
		skipped.Add(n)
	}
	return all, checkRead(s, all, skipped, "")
}

// readDecisionFile reads one log, "-" standard input, and closes it: a
// store of thousands of files is read one open file at a time.
func readDecisionFile(in io.Reader, name string, limits decisionlog.Limits) ([]decisionlog.Entry, decisionlog.Skipped, error) {
	r := in
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			// A file that is not there is the caller's to fix.
			return nil, decisionlog.Skipped{}, usage.Errorf("read decision log: %w", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.IsDir() {
			// Named, and not of the kind read: a log is a file.
			return nil, decisionlog.Skipped{}, usage.Errorf("read decision log %s: a directory, not a log file", name)
		}
		r = f
	} else {
		name = "standard input"
	}
	entries, n, err := decisionlog.ReadLimited(r, limits)
	if errors.Is(err, decisionlog.ErrFormat) {
		return nil, decisionlog.Skipped{}, usage.Wrap(fmt.Errorf("read decision log %s: %w", name, err))
	}
	if err != nil {
		return nil, decisionlog.Skipped{}, tooLarge(fmt.Errorf("read decision log %s: %w", name, err))
	}
	return entries, n, nil
}

// readCluster reads the manager pods' logs.
func readCluster(ctx context.Context, s streams, src sourceFlags, limits decisionlog.Limits) ([]decisionlog.Entry, error) {
	c, err := clusterSource(s, src, limits)
	if err != nil {
		return nil, err
	}
	entries, skipped, pods, err := c.Read(ctx)
	if err != nil {
		return nil, tooLarge(err)
	}
	return entries, checkRead(s, entries, skipped, fmt.Sprintf(" from %s in namespace %s (%s)", plural(len(pods), "pod", "pods"), c.Namespace, strings.Join(pods, ", ")))
}

// clusterSource is the manager pods' logs that --from-cluster and its flags
// name.
func clusterSource(s streams, src sourceFlags, limits decisionlog.Limits) (decisionlog.Cluster, error) {
	// kubectl's loading of --kubeconfig and --context, as every command that
	// speaks to an API server; its other flags would mean nothing here.
	flags := kube.NewConfigFlags()
	flags.KubeConfig, flags.Context = &src.kubeconfig, &src.context
	loader := flags.ToRawKubeConfigLoader()
	cfg, err := loader.ClientConfig()
	if err != nil {
		return decisionlog.Cluster{}, kube.ConfigError(err)
	}
	// Never the context's namespace, as kubectl would take: an operator's
	// context often points at a tenant's namespace, where a pod labelled
	// as the manager's would have its forged decisions shown and replayed
	// as the manager's (review of 2026-12-06). The manager's namespace is
	// one, and named when it is not the chart's documented one.
	namespace := cmp.Or(src.namespace, defaultNamespace)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return decisionlog.Cluster{}, fmt.Errorf("client: %w", err)
	}
	if _, err := labels.Parse(src.selector); err != nil {
		return decisionlog.Cluster{}, usage.Errorf("--selector: %v", err)
	}
	return decisionlog.Cluster{
		Client: client, Namespace: namespace, Selector: src.selector, Previous: src.previous, Limits: limits,
		Unreadable: func(pod string, err error) { podSkipped(s.err, pod, err) },
		Ended: func(pod string) {
			fmt.Fprintf(s.err, "ichor: the log of pod %s ended (its container stopped or restarted): its decisions from now on are not shown\n", line(pod))
		},
	}, nil
}

// podSkipped says that a pod's log could not be read, on one line: the API
// server's message (a 403 carries the authorizer's reason) may hold a
// newline that would print a line of its own (review 255 F6).
func podSkipped(w io.Writer, pod string, err error) {
	fmt.Fprintf(w, "ichor: pod %s skipped: %s\n", line(pod), termsafe.ErrorText(err))
}

// skippedNotes says what a read skipped, "" when nothing: other logs'
// lines and values, damaged entries, lines past the bound.
func skippedNotes(skipped decisionlog.Skipped) string {
	var parts []string
	if skipped.Lines > 0 {
		parts = append(parts, plural(skipped.Lines, "line", "lines"))
	}
	if skipped.Items > 0 {
		parts = append(parts, plural(skipped.Items, "JSON value", "JSON values"))
	}
	what := " that are not decision-log entries"
	if skipped.Lines+skipped.Items == 1 {
		what = " that is not a decision-log entry"
	}
	var notes []string
	if len(parts) > 0 {
		notes = append(notes, "skipped "+strings.Join(parts, " and ")+what)
	}
	if skipped.Damaged > 0 {
		// Told apart from other logs' lines: each may be a decision lost
		// (review 187).
		notes = append(notes, "skipped "+plural(skipped.Damaged, "damaged decision-log entry", "damaged decision-log entries")+" (JSON cut short: a line torn when the manager was stopped mid-write or its disk filled, or split by a log shipper)")
	}
	if skipped.Long > 0 {
		// Whatever they hold, unread: say so, and how to read them.
		notes = append(notes, "skipped "+plural(skipped.Long, "line", "lines")+" longer than --max-line-bytes, unread (the flag raises the bound)")
	}
	return strings.Join(notes, "; ")
}

// checkRead says on standard error what was read from where, and what was
// skipped, and fails when no decision was read.
func checkRead(s streams, all []decisionlog.Entry, skipped decisionlog.Skipped, from string) error {
	what := skippedNotes(skipped)
	if len(all) == 0 {
		if what == "" {
			what = "the input is empty"
		}
		return errors.New("no decision read" + from + ": " + what + `; a decision-log entry is a JSON object with msg "Decision Log" (the manager's standard output) or an OPA decision-log event (what --decision-log-url receives), one a line, in JSON arrays, or gzip-compressed`)
	}
	// The records that a verdict was applied are entries, not decisions:
	// counted apart, so that this count and list's and replay's agree.
	verdicts := decisionlog.Verdicts(all)
	decided := decisionlog.Decisions(verdicts)
	read := plural(len(decided), "decision", "decisions")
	records := len(all) - len(verdicts)
	if records > 0 {
		read += " and " + plural(records, "record of an applied verdict", "records of applied verdicts")
	}
	if len(verdicts) == 0 {
		// Records alone list nothing: as a log of no entry at all, the
		// wrong window of the log (review 187: "no decision matches",
		// exit 0).
		return errors.New("no decision read" + from + ": read only " + plural(records, "record of an applied verdict", "records of applied verdicts") + " (a record decides nothing: the decision it names is earlier in the log)")
	}
	if acts := len(verdicts) - len(decided); acts > 0 {
		read += " and " + plural(acts, "record of a person's act", "records of a person's acts")
	}
	switch {
	case what != "":
		fmt.Fprintf(s.err, "ichor: read %s%s; %s\n", read, from, what)
	case from != "":
		fmt.Fprintf(s.err, "ichor: read %s%s\n", read, from)
	}
	return nil
}

func newDecisionsListCommand(s streams) *cobra.Command {
	var f filterFlags
	var src sourceFlags
	output := newTablePrintFlags(true)
	var all, follow bool
	cmd := &cobra.Command{
		Use:   "list [FILE...|-] [--policy NAME] [--action ACTION] [--node NAME] [--user NAME] [--since WHEN] [--revision REV] [-o table|wide|json|yaml|name|jsonpath=TEMPLATE]",
		Short: "List the decisions of a decision log, in its order",
		Long: `List the decisions of a decision log, in the log's order, one a row: time,
decision id, policy, action, node (or user), reason codes and bundle revision.
The filters combine: a decision is listed when it meets every one given.

Only the verdicts in effect are listed: when an approver's write conflicted
and it decided again, the verdict it never applied is left out (--all lists
it, and the records of what was applied).

-o wide adds the decision path and the user. -o json, yaml and
jsonpath=TEMPLATE print a List (apiVersion v1) of Decision objects
(cli.ichor.dev/v1alpha1) with the same fields and the whole logged entry
under "entry" (-o 'jsonpath={.items[*].id}'); -o name prints
decision.cli.ichor.dev/ID, one a line, which "decisions show" takes.

--follow (with --from-cluster) tails the replicas' logs as kubectl logs -f
does and prints each decision as it is logged (in any -o; json and yaml
print each Decision as its own document), from --since (read by the API
server) or the whole log, until interrupted or every pod's log ends; the
verdicts never applied cannot be told apart while following, so every
verdict is printed (--all adds the applied records).

` + decisionsInput + `

Exit status: 0 when decisions were read (whether or not one matched), 1 when
the log could not be read or held no decision, or when -o json, yaml, name or
jsonpath left out a decision whose entry it cannot print (each is named on
standard error, the rest are printed; the table lists them all), 2 for a wrong
flag or a log that is not the shape it starts as (a gzip stream cut short,
say).`,
		Example: `  kubectl logs deploy/ichor-policy | ichor decisions list --action deny --since 24h
  ichor decisions list decisions.log --policy kubelet-serving --node worker-1 -o json`,
		RunE: func(cmd *cobra.Command, files []string) error {
			if err := output.complete(); err != nil {
				return err
			}
			crit, err := f.criteria(time.Now())
			if err != nil {
				return err
			}
			if follow {
				return followDecisions(cmd, s, src, files, crit, output, all)
			}
			entries, err := readDecisions(cmd, s, src, files)
			if err != nil {
				return err
			}
			if !all {
				entries = decisionlog.InEffect(entries)
			}
			matched := decisionlog.Filter(entries, crit)
			if !output.isHuman() {
				items := make([]unstructured.Unstructured, 0, len(matched))
				for _, e := range matched {
					d, err := decisionDocument(e)
					if err != nil {
						unprintable(s.err, e, err)
						continue
					}
					items = append(items, *d)
				}
				if err := output.print(s.out, documentList(items)); err != nil {
					return err
				}
				return leftOut(len(matched)-len(items), len(matched))
			}
			if len(matched) == 0 {
				fmt.Fprintf(s.err, "ichor: no decision matches (of %d read)\n", len(entries))
				return nil
			}
			t := decisionsTable()
			for _, e := range matched {
				addDecisionRow(t, e)
			}
			return output.printTable(s.out, t)
		},
	}
	f.register(cmd)
	src.register(cmd)
	output.register(cmd)
	cmd.Flags().BoolVar(&follow, "follow", false, "with --from-cluster: print the decisions as the replicas log them, as kubectl logs -f, until interrupted (from --since, else the whole log)")
	cmd.Flags().BoolVar(&all, "all", false, "also list verdicts that were never applied (an approver that met a conflict writing decides again; the one applied is recorded) and the applied records themselves")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// decisionsTable is the table of decisions list: -o wide adds the path
// and the user.
func decisionsTable() *metav1.Table {
	return newTable([]string{"Time", "ID", "Policy", "Action", "Node/User", "Codes", "Revision"}, "Path", "User")
}

func addDecisionRow(t *metav1.Table, e decisionlog.Entry) {
	addRow(t, formatTime(e.Timestamp), e.DecisionID, e.Policy(), e.Action(), e.Subject(), strings.Join(e.Codes(), ","), e.Revision, e.Path, e.User())
}

// decisionRecord is a decision as -o json, yaml and jsonpath see it: the
// table's fields, and the logged entry whole.
type decisionRecord struct {
	Time     time.Time       `json:"time"`
	ID       string          `json:"id"`
	Policy   string          `json:"policy"`
	Path     string          `json:"path"`
	Action   string          `json:"action"`
	Node     string          `json:"node"`
	User     string          `json:"user"`
	Codes    []string        `json:"codes"`
	Revision string          `json:"revision"`
	Entry    json.RawMessage `json:"entry"`
}

// unprintable says that a decision is left out of a document's output: its
// entry holds what the printers cannot hold (a number beyond float64's range,
// nesting deeper than apimachinery decodes), which anyone who writes a line
// of the log can put there. One such entry failed the whole listing before
// (review 255 F4); the table lists it.
func unprintable(w io.Writer, e decisionlog.Entry, err error) {
	fmt.Fprintf(w, "ichor: decision %s left out of the output: its entry cannot be printed as a document (%s); the table (-o wide) lists it\n",
		line(engine.Clip(e.DecisionID, "", 128)), line(engine.Clip(err.Error(), "", 512)))
}

// leftOut is the result of an output that left decisions out: an exit status
// of 1, so that a script reading the documents does not take a part for the
// whole (review 257: it exited 0, and only standard error said so).
func leftOut(n, of int) error {
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d decisions left out of the output (named above): their entries cannot be printed as documents; the table (-o wide) lists them", n, of)
}

// decisionDocument is a decision as list and show print it: a Decision
// named by its id.
func decisionDocument(e decisionlog.Entry) (*unstructured.Unstructured, error) {
	return document("Decision", "", e.DecisionID, decisionRecord{
		Time: e.Timestamp, ID: e.DecisionID, Policy: e.Policy(), Path: e.Path, Action: e.Action(),
		Node: e.Node(), User: e.User(), Codes: e.Codes(), Revision: e.Revision, Entry: e.Raw,
	})
}

func newDecisionsShowCommand(s streams) *cobra.Command {
	output := newTextPrintFlags(true)
	var src sourceFlags
	cmd := &cobra.Command{
		Use:   "show ID [FILE...|-] [-o text|json|yaml|name|jsonpath=TEMPLATE]",
		Short: "Show one decision whole: its reasons, input and result",
		Long: `Show one decision of a decision log: a header naming its time, policy, bundle
revision, action, node and user; its reasons as "CODE: message" lines (the
codes are explained in docs/policy.md); then its whole input, as the rule saw
it after the log mask, and its result, as indented JSON. ID is the decision id
that the CSR condition, the Event and the controller's log line carry; a
prefix of it that only one decision has will do.

-o json, yaml and jsonpath=TEMPLATE print the Decision that "decisions list"
prints, the logged entry whole under "entry"; ID may be what "decisions list
-o name" prints (decision.cli.ichor.dev/ID).

` + decisionsInput + `

Exit status: 0 when the decision was found, 1 when it is not in the log (or
the log could not be read), 2 for a wrong flag or no ID.`,
		Example: `  kubectl logs deploy/ichor-policy | ichor decisions show 34540ee1-195b-4060-b3f8-8b846718a4bd -`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usage.Errorf("give the decision ID to show (the CSR condition and the Event carry it)")
			}
			// An empty ID (an unset "$ID", or decision/) is a prefix of
			// every ID (review 172).
			if _, id, _ := strings.Cut(args[0], "/"); args[0] == "" || strings.HasSuffix(args[0], "/") && id == "" {
				return usage.Errorf("the decision ID is empty: give the ID the CSR condition and the Event carry, or a prefix of it")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := output.complete(); err != nil {
				return err
			}
			entries, err := readDecisions(cmd, s, src, args[1:])
			if err != nil {
				return err
			}
			e, err := findDecision(entries, args[0])
			if err != nil {
				return err
			}
			if !output.isHuman() {
				d, err := decisionDocument(e)
				if err != nil {
					return err
				}
				return output.print(s.out, d)
			}
			return writeShow(s.out, e)
		},
	}
	output.register(cmd)
	src.register(cmd)
	return cmd
}

// findDecision finds a decision by id, or by a prefix of exactly one id. The
// id may be named as -o name prints it, decision.cli.ichor.dev/ID.
func findDecision(entries []decisionlog.Entry, id string) (decisionlog.Entry, error) {
	if kind, rest, ok := strings.Cut(id, "/"); ok && (kind == "decision" || kind == "decision.cli.ichor.dev") {
		id = rest
	}
	// A set of the ids found, not a search of the list: a log of as many
	// entries under one prefix made each look a scan (review 172).
	var found []decisionlog.Entry
	seen := map[string]bool{}
	for _, e := range entries {
		if e.DecisionID == id {
			return e, nil
		}
		if strings.HasPrefix(e.DecisionID, id) && !seen[e.DecisionID] {
			seen[e.DecisionID] = true
			found = append(found, e)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return decisionlog.Entry{}, fmt.Errorf("decision %s is not in the log (%d decisions read): a decision of another replica is in that pod's log, one made before the container restarted in kubectl logs --previous, and an old one may have rotated out", line(id), len(entries))
	}
	return decisionlog.Entry{}, fmt.Errorf("decision %s is ambiguous: %d decisions have ids starting with it; give more of it", id, len(found))
}

func writeIndented(w io.Writer, raw json.RawMessage) error {
	if raw == nil {
		_, err := io.WriteString(w, "null\n")
		return err
	}
	out, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}

func writeShow(w io.Writer, e decisionlog.Entry) error {
	o := e.Outcome()
	policy := e.Policy()
	if policy != e.Path {
		policy += " (" + e.Path + ")"
	}
	field := func(name, value string) { fmt.Fprintf(w, "%-11s%s\n", name+":", line(value)) }
	field("Decision", e.DecisionID)
	field("Time", dash(timeNano(e.Timestamp)))
	field("Policy", policy)
	field("Revision", dash(e.Revision))
	field("Action", dash(o.Action))
	if n := e.Node(); n != "" {
		field("Node", n)
	}
	if u := e.User(); u != "" {
		field("User", u)
	}
	if len(e.Labels) > 0 {
		keys := make([]string, 0, len(e.Labels))
		for k := range e.Labels {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			keys[i] = k + "=" + e.Labels[k]
		}
		field("Labels", strings.Join(keys, " "))
	}

	fmt.Fprintln(w, "\nReasons:")
	switch {
	case len(o.Reasons) > 0:
		for _, r := range o.Reasons {
			fmt.Fprintf(w, "  %s: %s\n", line(r.Code), line(r.Message))
		}
	case o.Action == decisionlog.ActionNone:
		fmt.Fprintf(w, "  none: the rule was undefined for this input, so it does not govern it (%s)\n", line(decisionlog.ErrorText(e.Error)))
	case o.Action == decisionlog.ActionError:
		fmt.Fprintf(w, "  none: the evaluation failed: %s\n", line(o.Error))
	default:
		fmt.Fprintln(w, "  none given")
	}
	fmt.Fprintln(w, "\nInput:")
	if err := writeIndented(w, e.Input); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nResult:")
	return writeIndented(w, e.Result)
}

func timeNano(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

type replayOptions struct {
	filter    filterFlags
	source    sourceFlags
	bundle    string
	bundleKey bundleKeyFlags
	failOn    []string
	output    *printFlags
	all       bool
}

// notReplayed counts the log's entries a replay leaves out before its
// filters: the records that a verdict was applied, which decide nothing,
// and (without --all) the verdicts never applied, as list leaves them out.
type notReplayed struct {
	Records      int `json:"records"`
	NeverApplied int `json:"never_applied"`
	// Manual are the records of a person's acts (a CSR decided by hand, an
	// admin binding revoked): list lists them, but Ichor decided nothing in
	// them, so there is nothing to replay.
	Manual int `json:"manual"`
}

func newDecisionsReplayCommand(s streams) *cobra.Command {
	o := replayOptions{output: newTablePrintFlags(false)}
	cmd := &cobra.Command{
		Use:   "replay --bundle CANDIDATE [FILE...|-] [--fail-on DIRECTION]... [filters] [--all] [-o table|json|yaml|jsonpath=TEMPLATE]",
		Short: "Decide every logged input again with a candidate bundle and report what would change",
		Long: `Decide every logged decision's input again, at its rule's path, with a candidate
bundle (a policy directory laid out like policy/, or a bundle tarball; a
signed tarball is verified with --bundle-key, --bundle-key-id and
--bundle-key-algorithm, the managers' flags, and refused as they would refuse
it), and report each decision that would change, grouped by direction:

  approve → deny, deny → approve, approve → pending, pending → approve,
  deny → pending, pending → deny; for admission and issuance
  allowed → refused, refused → allowed; X → none when the candidate's rule is
  undefined for the input (it no longer governs it); X → error when the
  candidate cannot evaluate it.

A decision whose action stays but whose result changes beside its reasons
and messages is reported as "result changed" with the fields that changed:
another Talos role, groups, lifetime or admin binding role for the same
"allowed", another node for the same "approve" (a refusal's fields count
too). A decision whose action and result stay but whose set of reason codes
changes is reported as "reasons changed": only information. The summary
counts the unchanged decisions too. Replay counts what "decisions
list" lists: the verdicts in effect. The records that a verdict was applied
decide nothing and are never replayed, nor are the records of a person's acts
(a CSR decided by hand, an admin binding revoked: policy manual), which list
lists; a verdict that was never applied (an
approver met a conflict writing it and decided again) is replayed only with
--all. The summary says how many of each were left out. The filters of
"decisions list" select which decisions are replayed. Replay is exact because the rules do no
I/O: the input holds every fact the decision was made on. A candidate that
calls a builtin OPA marks non-deterministic (time.now_ns, http.send, net.*,
rand.*, uuid.rfc4122, opa.runtime, io.jwt.decode_verify, ...) is refused
(exit 1): what it returns is not in the log.

--fail-on names the changes that must not happen (repeat it, or separate them
with commas): a direction such as deny-to-approve or allowed-to-refused;
to-STATE, any direction ending in STATE (to-approve: deny-to-approve,
pending-to-approve, none-to-approve, ...); from-STATE; result-changed; any,
every direction and every result changed; reasons-changed, which "any" does
not include; truncated, the decisions left out because the log cut their
input (whoever makes a request can have it cut), which "any" does not
include either. STATE is one of approve, deny, pending, allowed, refused,
none, error.

` + decisionsInput + `

Exit status: 0 when the replay ran and no change named by --fail-on occurred;
3 when one did (the report is printed first); 1 when no decision could be
replayed (an unreadable log or bundle, a log with no decision, or none whose
input the log kept whole: an empty log proves nothing); 2 for a wrong flag.`,
		Example: `  kubectl logs deploy/ichor-policy > decisions.log
  ichor decisions replay --bundle ./policy decisions.log --fail-on deny-to-approve
  ichor decisions replay --bundle bundle.tar.gz decisions.log --fail-on to-approve,allowed-to-refused -o json`,
		RunE: func(cmd *cobra.Command, files []string) error {
			return runReplay(cmd, s, o, files)
		},
	}
	o.filter.register(cmd)
	o.source.register(cmd)
	f := cmd.Flags()
	f.StringVar(&o.bundle, "bundle", "", "the candidate: a policy directory or a bundle tarball (required)")
	o.bundleKey.register(f)
	f.StringSliceVar(&o.failOn, "fail-on", nil, "exit "+fmt.Sprint(ExitChanged)+" when a decision changes in this direction (repeatable): FROM-to-TO, to-STATE, from-STATE, result-changed, any, reasons-changed, truncated")
	o.output.register(cmd)
	f.BoolVar(&o.all, "all", false, "also replay the verdicts that were never applied (an approver that met a conflict writing decided again), as list --all lists them; the records of what was applied are never replayed")
	return cmd
}

func runReplay(cmd *cobra.Command, s streams, o replayOptions, files []string) error {
	ctx := cmd.Context()
	if err := o.output.complete(); err != nil {
		return err
	}
	if o.bundle == "" {
		return usage.Errorf("--bundle is required: the policy directory or bundle tarball to replay against")
	}
	for _, p := range o.failOn {
		if err := decisionlog.CheckFailOn(p); err != nil {
			return usage.Errorf("--fail-on: %v", err)
		}
	}
	crit, err := o.filter.criteria(time.Now())
	if err != nil {
		return err
	}
	entries, err := readDecisions(cmd, s, o.source, files)
	if err != nil {
		return err
	}
	// Replay counts what list counts: the verdicts in effect (every verdict
	// with --all), never the records that one was applied.
	verdicts := decisionlog.Verdicts(entries)
	considered := decisionlog.InEffect(entries)
	if o.all {
		considered = verdicts
	}
	decided := decisionlog.Decisions(considered)
	skipped := notReplayed{Records: len(entries) - len(verdicts), NeverApplied: len(verdicts) - len(considered), Manual: len(considered) - len(decided)}
	selected := decisionlog.Filter(decided, crit)
	if len(selected) == 0 {
		return fmt.Errorf("no decision to replay: %d decisions read, none selected; an empty replay proves nothing", len(decided))
	}
	// The replayed decisions are questions, not decisions anyone acts on:
	// they are not logged. OPA's own errors still reach stderr.
	opts := engine.Options{DecisionLog: io.Discard, Log: s.err}
	b, err := o.bundleKey.engineBundle(&opts, o.bundle)
	if err != nil {
		return err
	}
	if err := decisionlog.CheckReplayable(b); err != nil {
		return fmt.Errorf("%s cannot be replayed exactly: %w", o.bundle, err)
	}
	eng, err := engine.New(ctx, opts)
	if err != nil {
		return err
	}
	defer eng.Stop(context.WithoutCancel(ctx))
	if got := eng.Revision(); b != nil && o.bundleKey.key != "" && got != b.Manifest.Revision {
		// A signed bundle is read twice: once for the check above, once by
		// the engine, which verifies it; what was checked is what replays.
		return fmt.Errorf("%s changed while it was read (revision %s checked, %s loaded): replay it again", o.bundle, b.Manifest.Revision, got)
	}
	rep, err := decisionlog.Replay(ctx, eng, selected)
	if err != nil {
		return err
	}
	if rep.Replayed == 0 {
		return fmt.Errorf("no decision could be replayed: the log cut the input of all %d selected (input.log_truncated); an empty replay proves nothing", len(rep.Truncated))
	}
	if rep.Revision == "" {
		rep.Revision = b.Manifest.Revision
	}

	failed := map[string]int{}
	if slices.Contains(o.failOn, decisionlog.FailOnTruncated) && len(rep.Truncated) > 0 {
		failed[decisionlog.FailOnTruncated] = len(rep.Truncated)
	}
	for _, c := range rep.Changes {
		for _, p := range o.failOn {
			if c.Matches(p) {
				failed[p]++
			}
		}
	}
	logged := loggedRevisions(selected)
	if o.output.isHuman() {
		err = writeReplayTable(s.out, o, rep, logged, skipped)
	} else {
		err = printReplay(s.out, o, rep, logged, failed, skipped)
	}
	if err != nil {
		return err
	}
	if len(failed) == 0 {
		return nil
	}
	var parts []string
	for _, p := range o.failOn {
		if n := failed[p]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s (%d)", p, n))
		}
	}
	return exitError{ExitChanged, fmt.Errorf("decisions changed as --fail-on forbids: %s", strings.Join(parts, ", "))}
}

// loggedRevisions are the revisions the entries were decided under, in the
// order first met, found through a set: a forged log of as many revisions
// as entries made a scan of the list for each (review 172).
func loggedRevisions(entries []decisionlog.Entry) []string {
	var revs []string
	seen := map[string]bool{}
	for _, e := range entries {
		if e.Revision != "" && !seen[e.Revision] {
			seen[e.Revision] = true
			revs = append(revs, e.Revision)
		}
	}
	return revs
}

// namedRevisions is how the replay's summary line names the revisions: at
// most maxNamedRevisions, then how many more, not a line of megabytes.
func namedRevisions(revs []string) string {
	if len(revs) <= maxNamedRevisions {
		return strings.Join(revs, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(revs[:maxNamedRevisions], ", "), len(revs)-maxNamedRevisions)
}

// maxNamedRevisions is how many revisions the replay's summary line names.
const maxNamedRevisions = 10

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func noteTitle(note string) string { return strings.ReplaceAll(note, "-", " ") }

func writeReplayTable(w io.Writer, o replayOptions, rep decisionlog.Report, logged []string, skipped notReplayed) error {
	fmt.Fprintf(w, "Replayed %s logged under %s against %s (revision %s).\n\n",
		plural(rep.Replayed, "decision", "decisions"), line(dash(namedRevisions(logged))), line(o.bundle), line(dash(rep.Revision)))

	summary := newTable([]string{"Change", "Decisions"})
	for _, d := range decisionlog.SortedDirections(rep.Directions) {
		addRow(summary, decisionlog.Arrow(d), strconv.Itoa(rep.Directions[d]))
	}
	for _, n := range []string{decisionlog.NoteResultChanged, decisionlog.NoteReasonsChanged} {
		if rep.Notes[n] > 0 {
			addRow(summary, noteTitle(n)+" (same action)", strconv.Itoa(rep.Notes[n]))
		}
	}
	addRow(summary, "unchanged", strconv.Itoa(rep.Unchanged))
	if len(rep.Truncated) > 0 {
		addRow(summary, "not replayed: input cut in the log", strconv.Itoa(len(rep.Truncated)))
	}
	if len(rep.Redacted) > 0 {
		addRow(summary, "replayed on values the log redacted (among those above)", strconv.Itoa(len(rep.Redacted)))
	}
	if skipped.NeverApplied > 0 {
		addRow(summary, "not replayed: verdicts never applied (--all replays them)", strconv.Itoa(skipped.NeverApplied))
	}
	if skipped.Records > 0 {
		addRow(summary, "not replayed: records of applied verdicts (not decisions)", strconv.Itoa(skipped.Records))
	}
	if skipped.Manual > 0 {
		addRow(summary, "not replayed: records of a person's acts (not decisions)", strconv.Itoa(skipped.Manual))
	}
	if err := o.output.printTable(w, summary); err != nil {
		return err
	}
	if len(rep.Changes) == 0 {
		_, err := fmt.Fprintln(w, "\nNo decision would change.")
		return err
	}

	for _, d := range decisionlog.SortedDirections(rep.Directions) {
		fmt.Fprintf(w, "\n%s: %s\n", line(decisionlog.Arrow(d)), plural(rep.Directions[d], "decision", "decisions"))
		t := newTable([]string{"ID", "Time", "Policy", "Node/User", "Old → New", "New Codes"})
		for _, c := range rep.Changes {
			if c.Direction != d {
				continue
			}
			codes := strings.Join(c.New.Reasons.Codes(), ",")
			if c.New.Action == decisionlog.ActionError {
				codes = "error: " + c.New.Error
			}
			addRow(t, c.Entry.DecisionID, formatTime(c.Entry.Timestamp), c.Entry.Policy(), c.Entry.Subject(), decisionlog.Arrow(d), codes)
		}
		if err := o.output.printTable(w, t); err != nil {
			return err
		}
	}
	for _, n := range []string{decisionlog.NoteResultChanged, decisionlog.NoteReasonsChanged} {
		if rep.Notes[n] == 0 {
			continue
		}
		title, last := "%s, same action: %s\n", "Fields Changed"
		if n == decisionlog.NoteReasonsChanged {
			title, last = "%s, same action (information): %s\n", "Old Codes → New Codes"
		}
		fmt.Fprintf(w, "\n"+title, noteTitle(n), plural(rep.Notes[n], "decision", "decisions"))
		t := newTable([]string{"ID", "Time", "Policy", "Node/User", "Action", last})
		for _, c := range rep.Changes {
			if c.Note != n {
				continue
			}
			what := strings.Join(c.Changed, ",")
			if n == decisionlog.NoteReasonsChanged {
				what = dash(strings.Join(c.Old.Reasons.Codes(), ",")) + " → " + dash(strings.Join(c.New.Reasons.Codes(), ","))
			}
			addRow(t, c.Entry.DecisionID, formatTime(c.Entry.Timestamp), c.Entry.Policy(), c.Entry.Subject(), c.New.Action, what)
		}
		if err := o.output.printTable(w, t); err != nil {
			return err
		}
	}
	return nil
}

type replayChangeJSON struct {
	ID        string    `json:"id"`
	Time      time.Time `json:"time"`
	Policy    string    `json:"policy"`
	Path      string    `json:"path"`
	Node      string    `json:"node"`
	User      string    `json:"user"`
	Direction string    `json:"direction,omitempty"`
	Note      string    `json:"note,omitempty"`
	// Changed, OldResult and NewResult say what a result-changed
	// decision changed: the fields, and both results whole.
	Changed   []string            `json:"changed,omitempty"`
	OldResult json.RawMessage     `json:"old_result,omitempty"`
	NewResult json.RawMessage     `json:"new_result,omitempty"`
	Old       decisionlog.Outcome `json:"old"`
	New       decisionlog.Outcome `json:"new"`
}

type replayJSON struct {
	Candidate struct {
		Bundle   string `json:"bundle"`
		Revision string `json:"revision"`
	} `json:"candidate"`
	LoggedRevisions []string           `json:"logged_revisions"`
	Replayed        int                `json:"replayed"`
	Unchanged       int                `json:"unchanged"`
	Directions      map[string]int     `json:"directions"`
	Notes           map[string]int     `json:"notes"`
	Changes         []replayChangeJSON `json:"changes"`
	// Truncated are the ids of the decisions not replayed because the log
	// kept only part of their input.
	Truncated []string `json:"truncated"`
	// Redacted are the ids of the decisions replayed on an input whose
	// values the log redacted (counted in replayed).
	Redacted []string `json:"redacted"`
	FailOn   []string `json:"fail_on"`
	// Failed counts the changes per --fail-on value that matched.
	Failed map[string]int `json:"failed"`
	// NotReplayed counts the entries left out before the filters: they
	// are not counted in replayed.
	NotReplayed notReplayed `json:"not_replayed"`
}

// printReplay prints the report as a DecisionReplay document.
func printReplay(w io.Writer, o replayOptions, rep decisionlog.Report, logged []string, failed map[string]int, skipped notReplayed) error {
	out := replayJSON{
		LoggedRevisions: logged, Replayed: rep.Replayed, Unchanged: rep.Unchanged,
		Directions: rep.Directions, Notes: rep.Notes, Changes: []replayChangeJSON{},
		FailOn: o.failOn, Failed: failed, Truncated: []string{}, Redacted: []string{}, NotReplayed: skipped,
	}
	for _, e := range rep.Truncated {
		out.Truncated = append(out.Truncated, e.DecisionID)
	}
	for _, e := range rep.Redacted {
		out.Redacted = append(out.Redacted, e.DecisionID)
	}
	if out.LoggedRevisions == nil {
		out.LoggedRevisions = []string{}
	}
	if out.FailOn == nil {
		out.FailOn = []string{}
	}
	out.Candidate.Bundle, out.Candidate.Revision = o.bundle, rep.Revision
	for _, c := range rep.Changes {
		j := replayChangeJSON{
			ID: c.Entry.DecisionID, Time: c.Entry.Timestamp, Policy: c.Entry.Policy(), Path: c.Entry.Path,
			Node: c.Entry.Node(), User: c.Entry.User(), Direction: c.Direction, Note: c.Note, Old: c.Old, New: c.New,
		}
		if c.Note == decisionlog.NoteResultChanged {
			j.Changed, j.OldResult, j.NewResult = c.Changed, c.Old.Result, c.New.Result
		}
		out.Changes = append(out.Changes, j)
	}
	d, err := document("DecisionReplay", "", "", out)
	if err != nil {
		return err
	}
	return o.output.print(w, d)
}

// followDecisions prints the manager pods' decisions as they are logged:
// in the table forms, each as a row of one table (its header printed once);
// in the others, each as its own document.
func followDecisions(cmd *cobra.Command, s streams, src sourceFlags, files []string, crit decisionlog.Criteria, output *printFlags, all bool) error {
	switch {
	case !src.fromCluster:
		return usage.Errorf("--follow tails the manager pods' logs: give --from-cluster")
	case len(files) > 0:
		return usage.Errorf("--from-cluster reads the manager pods' logs: give no FILE (%s)", strings.Join(files, " "))
	case src.previous:
		return usage.Errorf("--follow and --previous contradict each other: a previous container's log does not grow")
	case cmd.Flags().Changed("max-log-bytes") || cmd.Flags().Changed("max-log-entries"):
		// Following holds nothing and reads without end: the bounds of a
		// read have nothing to bound, and were taken without a word
		// (review 202 F6). --max-line-bytes bounds each line still.
		return usage.Errorf("--follow reads each line as it comes and keeps none: --max-log-bytes and --max-log-entries bound a whole read, not a following (--max-line-bytes bounds each line)")
	}
	limits, err := src.limits()
	if err != nil {
		return err
	}
	c, err := clusterSource(s, src, limits)
	if err != nil {
		return err
	}
	var since *metav1.Time
	if !crit.Since.IsZero() {
		since = &metav1.Time{Time: crit.Since}
	}
	rows := output.tablePrinter()
	matched, unprinted := 0, 0
	pods, skipped, err := c.Follow(cmd.Context(), since, func(_ string, e decisionlog.Entry) error {
		if (!all && len(decisionlog.Verdicts([]decisionlog.Entry{e})) == 0) || len(decisionlog.Filter([]decisionlog.Entry{e}, crit)) == 0 {
			return nil
		}
		if output.isHuman() {
			// Each row as it comes: a row waits for no other to be aligned with.
			t := decisionsTable()
			addDecisionRow(t, e)
			return rows.PrintObj(t, s.out)
		}
		matched++
		d, err := decisionDocument(e)
		if err != nil {
			unprinted++
			unprintable(s.err, e, err)
			return nil
		}
		return output.print(s.out, d)
	})
	// What may have held a decision and was not read is said however the
	// following ends (review 190: it went unsaid).
	if notes := skippedNotes(skipped); notes != "" {
		fmt.Fprintf(s.err, "ichor: %s\n", notes)
	}
	if err != nil {
		return err
	}
	if cmd.Context().Err() == nil {
		fmt.Fprintf(s.err, "ichor: the logs of %s ended\n", strings.Join(pods, ", "))
	}
	return leftOut(unprinted, matched)
}
