package kubeconfig

// ListBytesInUse is what the lists being read (or leased) from tenant's
// servers hold of its budget.
func ListBytesInUse(l *Local, tenant string) int64 {
	b := l.listBudget(tenant)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
