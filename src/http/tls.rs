//! TLS without a proxy: with `server.tls_cert` and `server.tls_key` (PEM files) the listener
//! speaks only TLS, so clients use `https://` and `wss://` directly. The only module that imports
//! rustls.
//!
//! Handshakes run in each connection's own task (`http::connections`), bounded by
//! `server.tls_handshake_timeout_ms`: a client that opens a socket and says nothing never holds
//! up the accept loop. `Tls::reload` (SIGHUP) reads the files again; new connections
//! get the new certificate, live ones (sessions included) keep theirs, and a file that does not
//! load leaves the old certificate in place.
//!
//! Also the client side of the one outbound https:// request ackgate makes: fetching an
//! identity provider's key set and the peers' `/readyz` over https:// (`http::fetch`), verified
//! against given authorities.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::activity::{Activity, HasActivity};
use super::lingering::LingeringStream;

/// The certificate and key in use, and where they were read from.
pub struct Tls {
    cert_path: PathBuf,
    key_path: PathBuf,
    acceptor: RwLock<TlsAcceptor>,
    /// When the certificate in use expires (epoch seconds; 0: not read from it).
    not_after: AtomicU64,
}

impl Tls {
    /// Reads both files; an error names the file and what is wrong with it.
    pub fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<Self> {
        let (config, not_after) = server_config(cert_path, key_path)?;
        Ok(Self {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            acceptor: RwLock::new(TlsAcceptor::from(Arc::new(config))),
            not_after: AtomicU64::new(not_after.unwrap_or(0)),
        })
    }

    /// Reads the files again for new connections. On error the current certificate stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let (config, not_after) = server_config(&self.cert_path, &self.key_path)?;
        *self.acceptor.write().unwrap_or_else(|e| e.into_inner()) = TlsAcceptor::from(Arc::new(config));
        self.not_after.store(not_after.unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    /// When the certificate in use (the chain's first) expires, in seconds since the epoch;
    /// `None` when its validity could not be read.
    pub fn not_after(&self) -> Option<u64> {
        Some(self.not_after.load(Ordering::Relaxed)).filter(|at| *at > 0)
    }

    fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The server configuration of the two files, and when the certificate expires.
fn server_config(cert_path: &Path, key_path: &Path) -> anyhow::Result<(ServerConfig, Option<u64>)> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect())
        .with_context(|| format!("server.tls_cert {}: not a readable PEM certificate chain", cert_path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "server.tls_cert {}: no CERTIFICATE block in the file", cert_path.display());
    let not_after = super::certificate_expiry::not_after(&certs[0]);
    let key = PrivateKeyDer::from_pem_file(key_path).with_context(|| format!("server.tls_key {}: not a readable PEM private key", key_path.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .with_context(|| format!("server.tls_key {} does not match server.tls_cert {}", key_path.display(), cert_path.display()))?;
    // The server speaks HTTP/1.1 only (WebSocket upgrades included).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, not_after))
}

impl Tls {
    /// The TLS handshake of an accepted connection, bounded by `timeout`; `None` when it failed
    /// or took too long (logged at debug: scanners do this all day).
    pub async fn handshake(&self, stream: LingeringStream, timeout: Duration) -> Option<TlsStream<LingeringStream>> {
        match tokio::time::timeout(timeout, self.acceptor().accept(stream)).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(?timeout, "TLS handshake timed out");
                None
            }
        }
    }
}

impl HasActivity for TlsStream<LingeringStream> {
    fn activity(&self) -> Arc<Activity> {
        self.get_ref().0.activity()
    }
}

/// A TLS connection to `host` over `tcp`, its certificate verified against the authorities in
/// `ca_file` (PEM; empty: the system's, /etc/ssl/certs/ca-certificates.crt), read once per file.
pub async fn connect_verified(tcp: tokio::net::TcpStream, host: &str, ca_file: &str) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let config = client_config(ca_file)?;
    let name = rustls::pki_types::ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string()).map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))
}

/// The client configuration of `ca_file`, built at its first use (a probe every two seconds
/// must not parse the system's bundle each time).
fn client_config(ca_file: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    static BUILT: std::sync::Mutex<Vec<(String, Arc<rustls::ClientConfig>)>> = std::sync::Mutex::new(Vec::new());
    if let Some((_, config)) = BUILT.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(file, _)| file == ca_file) {
        return Ok(config.clone());
    }
    let file = if ca_file.is_empty() { "/etc/ssl/certs/ca-certificates.crt" } else { ca_file };
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(file).map_err(|e| format!("reading {file}: {e}"))? {
        // One authority the TLS library cannot use leaves the others.
        let _ = roots.add(certificate.map_err(|e| format!("reading {file}: {e}"))?);
    }
    if roots.is_empty() {
        return Err(format!("{file} holds no certificate authority"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let config = Arc::new(config);
    BUILT.lock().unwrap_or_else(|e| e.into_inner()).push((ca_file.to_string(), config.clone()));
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_or_mismatched_files_are_refused_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        let error = Tls::load(&cert, &key).err().unwrap().to_string();
        assert!(error.contains("server.tls_cert") && error.contains("cert.pem"), "{error}");
        std::fs::write(&cert, "not a certificate").unwrap();
        std::fs::write(&key, "not a key").unwrap();
        let error = Tls::load(&cert, &key).err().unwrap().to_string();
        assert!(error.contains("no CERTIFICATE block"), "{error}");
    }
}
