package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
)

// fileLoggerName is the decision-log plugin that appends entries to a file.
const fileLoggerName = "ichor_decision_log_file"

type fileLoggerConfig struct {
	Path string `json:"path"`
}

type fileLoggerFactory struct{ engine *Engine }

func (f *fileLoggerFactory) Validate(_ *plugins.Manager, config []byte) (any, error) {
	var c fileLoggerConfig
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, fmt.Errorf("decision-log file: %w", err)
	}
	if c.Path == "" {
		return nil, fmt.Errorf("decision-log file: no path")
	}
	return c, nil
}

func (f *fileLoggerFactory) New(m *plugins.Manager, config any) plugins.Plugin {
	return &fileLogger{manager: m, config: config.(fileLoggerConfig), engine: f.engine}
}

// fileLogger writes each decision-log entry (already masked by OPA's
// decision-log plugin) as one JSON line, the same shape `ichor decisions`
// reads from the console sink.
type fileLogger struct {
	manager *plugins.Manager
	config  fileLoggerConfig
	engine  *Engine

	mu sync.Mutex
	f  *os.File
}

var _ logs.Logger = (*fileLogger)(nil)

func (l *fileLogger) Start(context.Context) error {
	f, err := os.OpenFile(l.config.Path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		l.manager.UpdatePluginStatus(fileLoggerName, &plugins.Status{State: plugins.StateErr, Message: err.Error()})
		return fmt.Errorf("decision-log file: %w", err)
	}
	l.mu.Lock()
	l.f = f
	l.mu.Unlock()
	l.manager.UpdatePluginStatus(fileLoggerName, &plugins.Status{State: plugins.StateOK})
	return nil
}

func (l *fileLogger) Stop(context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
}

func (l *fileLogger) Reconfigure(context.Context, any) {}

// Log writes one entry. An entry that cannot be written is counted as
// dropped, and the error fails the decision: a decision that is not logged
// is not acted on.
func (l *fileLogger) Log(_ context.Context, event logs.EventV1) error {
	line, err := json.Marshal(entryFields(event))
	if err == nil {
		line = append(line, '\n')
		l.mu.Lock()
		if l.f == nil {
			err = fmt.Errorf("decision-log file is closed")
		} else {
			_, err = l.f.Write(line)
		}
		l.mu.Unlock()
	}
	if err != nil {
		if l.engine != nil && l.engine.metrics != nil {
			l.engine.metrics.dropped("file")
		}
		return fmt.Errorf("decision-log file %s: %w", l.config.Path, err)
	}
	return nil
}

// entryFields is an event in the console sink's shape.
func entryFields(e logs.EventV1) map[string]any {
	m := map[string]any{
		"msg":         "Decision Log",
		"type":        "openpolicyagent.org/decision_logs",
		"decision_id": e.DecisionID,
		"path":        e.Path,
		"labels":      e.Labels,
		"bundles":     e.Bundles,
		"timestamp":   e.Timestamp,
		"time":        e.Timestamp,
	}
	if e.Input != nil {
		m["input"] = *e.Input
	}
	if e.Result != nil {
		m["result"] = *e.Result
	}
	if e.Error != nil {
		m["error"] = e.Error
	}
	if len(e.Erased) > 0 {
		m["erased"] = e.Erased
	}
	if len(e.Masked) > 0 {
		m["masked"] = e.Masked
	}
	return m
}
