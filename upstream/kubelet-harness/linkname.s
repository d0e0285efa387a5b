// An empty assembly file: it lets main.go declare newManagerImpl without a body (go:linkname).
