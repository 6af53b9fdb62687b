package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ichor-dev/ichor-policy/internal/usage"
)

// probeMaxBytes bounds what a probe reads of an answer: the manager's
// metrics are a few tens of KiB.
const probeMaxBytes = 4 << 20

func newProbeCommand(s streams) *cobra.Command {
	var (
		contains string
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "probe URL [--contains TEXT] [--timeout 2m]",
		Short: "Check that a manager answers over HTTP (the chart's helm test)",
		Long: `Ask URL (http or https) until it answers 200 OK, with TEXT in the body if
--contains is given, or until --timeout has passed. The image holds nothing
but the ichor binary, so the chart's helm test runs this to check that the
manager serves its metrics:

  ichor probe http://ichor-policy-metrics.ichor-system.svc:8080/metrics --contains ichor_build_info

Exit status 0 when it answered so, 1 when it did not in time.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := url.Parse(args[0])
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usage.Errorf("%q: the URL is http:// or https://", args[0])
			}
			if timeout <= 0 {
				return usage.Errorf("--timeout %s: it must be positive", timeout)
			}
			return probe(cmd.Context(), s, u.String(), contains, timeout)
		},
	}
	cmd.Flags().StringVar(&contains, "contains", "", "text the answer's body must contain")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to keep asking")
	return cmd
}

// probe asks target until it answers as wanted or timeout has passed; the
// last failure is the error.
func probe(ctx context.Context, s streams, target, contains string, timeout time.Duration) error {
	client := &http.Client{Timeout: 10 * time.Second}
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		err := probeOnce(ctx, client, target, contains)
		// An ask cut short by the deadline says nothing about the server:
		// the answer before it is the one to report.
		if err == nil || ctx.Err() == nil || last == nil {
			last = err
		}
		return err == nil, nil
	})
	if err != nil {
		if last == nil {
			last = err
		}
		return fmt.Errorf("%s did not answer as expected within %s: %w", target, timeout, last)
	}
	_, err = fmt.Fprintf(s.out, "%s answered 200 OK\n", target)
	return err
}

func probeOnce(ctx context.Context, client *http.Client, target, contains string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, probeMaxBytes))
	if err != nil {
		return fmt.Errorf("read the answer: %w", err)
	}
	if contains != "" && !strings.Contains(string(body), contains) {
		return errors.New("the answer does not contain " + fmt.Sprintf("%q", contains))
	}
	return nil
}
