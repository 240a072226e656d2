// Package tlsreload serves a certificate and key pair, and optionally a CA
// bundle, from files, and reloads them when the files change, so that new
// TLS handshakes use the new certificate without a restart while
// connections already open keep theirs.
//
// A [Reloader] polls the files' identity, size and modification time
// (os.Stat follows symbolic links, so the symlink swap by which Kubernetes
// updates a mounted Secret is seen as a change of every file). On a change
// it reads and checks all the files together; a file that is unreadable,
// unparsable or does not match its pair keeps the material in force, and
// the failure is logged and counted in flashgate_tls_reloads_total
// {result="error"}. The next change of any file is tried again;
// [Reloader.Load] reads the files whether or not they look changed.
//
// [Reloader.ServerConfig] is a server's tls.Config (mTLS when a CA is
// given: client certificates required and verified against it);
// [Reloader.ClientConfig] is a client's (its certificate, when given, sent
// on request; the server verified against the CA, when given, else the
// system roots).
package tlsreload
