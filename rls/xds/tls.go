package xds

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLSConfig returns an xDS connection's client TLS config: the CA in caFile
// (the system's when ""), an optional client certificate, and serverName
// replacing the address's host in verification.
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
