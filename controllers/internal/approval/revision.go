package approval

// revisioner is a decider that says which policy bundle is active (the
// engine).
type revisioner interface{ Revision() string }

// ActiveRevision is the revision of the bundle decider serves, or "" when it
// does not say (then a verdict lasts as long as the facts it was reached on).
// A verdict remembered under one revision is reached again under another:
// an operator's new bundle judges the requests left pending by the last one.
func ActiveRevision(decider any) string {
	if r, ok := decider.(revisioner); ok {
		return r.Revision()
	}
	return ""
}
