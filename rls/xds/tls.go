package xds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSConfig returns the client TLS config of an xDS connection: the server
// is verified against the CA certificates in caFile (PEM), or the system's
// when caFile is ""; certFile and keyFile (PEM, both or neither) are the
// client certificate an mTLS server asks for. serverName, when not "",
// replaces the host of the server address in verification (ratelimit's
// CONFIG_GRPC_XDS_SERVER_TLS_SAN).
func TLSConfig(certFile, keyFile, caFile, serverName string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("xds tls: a client certificate needs both its cert and key file")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("xds tls: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("xds tls: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("xds tls: CA file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
