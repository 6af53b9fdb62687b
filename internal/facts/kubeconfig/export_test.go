package kubeconfig

import "time"

// ListBytesInUse is what the lists being read (or leased) from tenant's
// servers hold of its budget.
func ListBytesInUse(l *Local, tenant string) int64 {
	b := l.listBudget(tenant)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// ExpireLocal has the local API server's key and CA read again at their
// next use, as LocalRereadAfter does.
func ExpireLocal(l *Local) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.readAt = time.Time{}
}

// SetHTTP2HealthCheck sets how long a connection to a tenant may be silent
// before it is pinged and how long the ping may take, until restore.
func SetHTTP2HealthCheck(idle, ping time.Duration) (restore func()) {
	oldIdle, oldPing := http2ReadIdleTimeout, http2PingTimeout
	http2ReadIdleTimeout, http2PingTimeout = idle, ping
	return func() { http2ReadIdleTimeout, http2PingTimeout = oldIdle, oldPing }
}
