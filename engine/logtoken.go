package engine

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/ichor-dev/ichor-policy/bundles"
)

// maxDecisionLogTokenBytes bounds the decision-log service's token file: a
// bearer token is at most a few kilobytes (a JWT with its claims).
const maxDecisionLogTokenBytes = 16 << 10

// decisionLogToken reads the bearer token the decision-log service is sent
// (Options.DecisionLogTokenFile), as OPA's services read
// credentials.bearer.token_path: a mounted Secret's key, read at each upload
// so that a rotated Secret is used at the next. The file is a regular file
// of at most maxDecisionLogTokenBytes holding one token of RFC 6750's
// characters, with surrounding white space (a Secret's trailing newline)
// dropped. No error quotes the file's content: it is a credential, and the
// errors reach the manager's log.
func decisionLogToken(path string) (string, error) {
	data, err := readCredentialFile(path, maxDecisionLogTokenBytes, "decision-log token")
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(data))
	switch {
	case token == "":
		return "", fmt.Errorf("decision-log token: %s is empty", path)
	case !isBearerToken(token):
		// A line break in it would end the Authorization header and
		// begin another; and a file of two lines is not one token.
		return "", fmt.Errorf("decision-log token: %s holds characters a bearer token has not (RFC 6750: letters, digits, -._~+/ and = at the end)", path)
	}
	return token, nil
}

// isBearerToken reports whether s is RFC 6750's b64token:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func isBearerToken(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for _, c := range []byte(body) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("-._~+/", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// checkDecisionLogCredential refuses a token file the service would not
// get, or would get where anyone could read it: one without a service, one
// beside a password in the service's URL (which of the two is sent would be
// a guess), and one for a service over plain http off this host's loopback,
// whatever --decision-log-allow-insecure-http says (that flag accepts an
// on-path reader of the decisions; a token it read would also let it write
// decisions of its own). The token is read once here, so that one that
// cannot be used fails the start with its reason.
func checkDecisionLogCredential(opts Options) error {
	if opts.DecisionLogTokenFile == "" {
		return nil
	}
	if opts.DecisionLogURL == "" {
		return fmt.Errorf("a decision-log token (%s) is for a decision-log service: give its URL too", opts.DecisionLogTokenFile)
	}
	u, err := url.Parse(opts.DecisionLogURL)
	if err != nil {
		return fmt.Errorf("decision-log service: the URL does not parse")
	}
	if _, hasPassword := u.User.Password(); hasPassword {
		return fmt.Errorf("decision-log service %s: give its credential either as a password in its URL or as a token file, not both", u.Redacted())
	}
	if u.Scheme == "http" && !bundles.OnLoopback(u.Host) {
		return fmt.Errorf("decision-log service %s is plain http: its token is sent only over https, or to a service on this host's loopback", u.Redacted())
	}
	_, err = decisionLogToken(opts.DecisionLogTokenFile)
	return err
}
