"""The adapters: the I/O that feeds the core and carries its answers out (sysfs, the API
server, the kubelet's sockets, files, HTTP bodies, logs), thin and without decisions."""
