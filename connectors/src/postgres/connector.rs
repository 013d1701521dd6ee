//! TLS for the `postgres` client through rustls (already built for object storage), with the
//! checks of libpq's modes: none (`prefer`, `require`), the CA only (`verify-ca`), or the CA
//! and the host name (`verify-full`); handshake failures are told in words.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::tls::{split_url, SslMode, TlsConfig, TlsSettingError, Verify};

/// Makes one TLS handshake per connection attempt, with the sink's trust settings.
#[derive(Clone)]
pub(super) struct RustlsConnect {
    config: Arc<ClientConfig>,
    /// What signs a certificate we accept, for messages.
    trust: String,
    client_cert: bool,
}

impl RustlsConnect {
    /// Reads the files `tls` names (a missing or unreadable one is an error naming it).
    pub fn new(verify: Verify, tls: &TlsConfig) -> Result<Self, TlsSettingError> {
        let provider = Arc::new(ring::default_provider());
        let (roots, trust) = roots(tls, verify)?;
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsSettingError::new("tls", format!("TLS set-up: {e}")))?;
        let builder = match verify {
            Verify::Nothing => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider.clone()))),
            Verify::Chain | Verify::ChainAndHost => {
                let roots = roots.ok_or_else(|| {
                    TlsSettingError::new(
                        "tls.ca_file",
                        "no `tls.ca_file` and no trusted CA certificates found on this system: \
                         give the CA that signed the server's certificate as `tls.ca_file`",
                    )
                })?;
                let webpki =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|e| {
                            TlsSettingError::new("tls.ca_file", format!("{trust}: {e}"))
                        })?;
                if verify == Verify::Chain {
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
                } else {
                    builder.with_webpki_verifier(webpki)
                }
            }
        };
        let config = match (&tls.client_cert, &tls.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = certificates(cert, "tls.client_cert")?;
                let bytes = read(key, "tls.client_key")?;
                let key_der = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
                    TlsSettingError::new(
                        "tls.client_key",
                        format!(
                            "`tls.client_key` {} holds no PEM private key: {e}",
                            key.display()
                        ),
                    )
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    TlsSettingError::new(
                        "tls.client_key",
                        format!(
                            "`tls.client_key` {} does not go with `tls.client_cert` {}: {e}",
                            key.display(),
                            cert.display()
                        ),
                    )
                })?
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(TlsSettingError::new(
                    "tls",
                    "`tls.client_cert` and `tls.client_key` go together: give both or neither",
                ))
            }
        };
        Ok(RustlsConnect {
            config: Arc::new(config),
            trust,
            client_cert: tls.client_cert.is_some(),
        })
    }
}

/// The trusted CAs (none found, or none needed: `None`) and how to name them; a `ca_file` is
/// read even when nothing is checked, so that a wrong path shows.
fn roots(
    tls: &TlsConfig,
    verify: Verify,
) -> Result<(Option<RootCertStore>, String), TlsSettingError> {
    let mut roots = RootCertStore::empty();
    if let Some(path) = &tls.ca_file {
        for cert in certificates(path, "tls.ca_file")? {
            roots.add(cert).map_err(|e| {
                TlsSettingError::new(
                    "tls.ca_file",
                    format!(
                        "`tls.ca_file` {}: not a CA certificate: {e}",
                        path.display()
                    ),
                )
            })?;
        }
        return Ok((
            Some(roots),
            format!("the CA of `tls.ca_file` ({})", path.display()),
        ));
    }
    let trust = "the system's trusted CAs".to_string();
    if verify == Verify::Nothing {
        return Ok((None, trust));
    }
    let found = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(found.certs);
    Ok(((!roots.is_empty()).then_some(roots), trust))
}

fn read(path: &Path, key: &'static str) -> Result<Vec<u8>, TlsSettingError> {
    std::fs::read(path).map_err(|e| {
        TlsSettingError::new(key, format!("cannot read `{key}` {}: {e}", path.display()))
    })
}

fn certificates(
    path: &Path,
    key: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsSettingError> {
    let bytes = read(path, key)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsSettingError::new(key, format!("`{key}` {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(TlsSettingError::new(
            key,
            format!(
                "`{key}` {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ),
        ));
    }
    Ok(certs)
}

/// `verify-ca`: the chain to a trusted CA, whatever names the certificate holds (webpki
/// checks the chain before the name, so a name error means the chain was good).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a CA: encryption against eavesdropping only, as libpq.
/// The handshake's signatures are still checked against the certificate presented.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Why a TLS connection failed, in words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct HandshakeError(String);

/// One connection attempt's handshake, to `host`.
pub(super) struct Handshake {
    config: Arc<ClientConfig>,
    host: String,
    trust: String,
    client_cert: bool,
}

impl<S> MakeTlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = Handshake;
    type Error = HandshakeError;

    fn make_tls_connect(&mut self, host: &str) -> Result<Handshake, HandshakeError> {
        // The name is checked when the handshake happens: `prefer` over a Unix socket (no
        // host name) never gets that far.
        Ok(Handshake {
            config: self.config.clone(),
            host: host.to_string(),
            trust: self.trust.clone(),
            client_cert: self.client_cert,
        })
    }
}

impl<S> TlsConnect<S> for Handshake
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = HandshakeError;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream<S>, HandshakeError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = ServerName::try_from(self.host.clone()).map_err(|e| {
                HandshakeError(format!(
                    "`{}` is not a host name or IP address TLS can check: {e}",
                    self.host
                ))
            })?;
            tokio_rustls::TlsConnector::from(self.config.clone())
                .connect(name, stream)
                .await
                .map(RustlsStream)
                .map_err(|e| HandshakeError(self.explain(&e)))
        })
    }
}

impl Handshake {
    fn explain(&self, e: &io::Error) -> String {
        let Some(tls) = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        else {
            return format!("the TLS handshake failed: {e}");
        };
        let trust = &self.trust;
        match tls {
            rustls::Error::InvalidCertificate(
                c @ (CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. }),
            ) => format!(
                "certificate verification failed: the server's certificate does not match the \
                 host name `{}` ({c}); sslmode verify-full checks the name: connect by a name \
                 the certificate holds, or use verify-ca to check only that {trust} signed it",
                self.host
            ),
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => format!(
                "certificate verification failed: the server's certificate is not signed by \
                 {trust} (UnknownIssuer)"
            ),
            rustls::Error::InvalidCertificate(c) => format!(
                "certificate verification failed: {c} (the server's certificate, checked \
                 against {trust})"
            ),
            rustls::Error::AlertReceived(alert) => format!(
                "the server ended the TLS handshake ({alert:?}){}",
                if self.client_cert {
                    "; check that the server trusts the CA of `tls.client_cert`"
                } else {
                    ""
                }
            ),
            other => format!("the TLS handshake failed: {other}"),
        }
    }
}

/// The encrypted connection (a type of our own: the client's trait is foreign to rustls').
pub(super) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    /// SCRAM without channel binding (`tls-server-end-point` would need the certificate's
    /// signature hash); the server accepts it unless its pg_hba asks for `channel_binding`.
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

/// A self-signed CA certificate for unit tests (no key: nothing signs with it here).
/// How the sink connects: the connection string without its TLS parameters, the mode, and
/// the TLS connector (none with `disable`).
pub(super) struct Settled {
    pub url: String,
    pub mode: SslMode,
    pub connector: Option<RustlsConnect>,
    /// What the connector checks (built into its verifier; read here by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub verify: Verify,
}

/// The mode from the URL and `tls` (which must agree when both say one); without either, a
/// plain connection, as before TLS was supported.
pub(super) fn settle(url: &str, tls: Option<&TlsConfig>) -> Result<Settled, TlsSettingError> {
    let (url, url_mode) = split_url(url).map_err(|m| TlsSettingError::new("url", m))?;
    let mode = match (url_mode, tls.and_then(|t| t.mode)) {
        (Some(a), Some(b)) if a != b => {
            return Err(TlsSettingError::new(
                "tls.mode",
                format!(
                    "`tls.mode` is {} but `url` says sslmode={}: give the mode in one place",
                    b.name(),
                    a.name()
                ),
            ))
        }
        (Some(mode), _) | (None, Some(mode)) => mode,
        (None, None) if tls.is_some() => SslMode::VerifyFull,
        (None, None) => SslMode::Disable,
    };
    let has_ca = tls.is_some_and(|t| t.ca_file.is_some());
    let verify = match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require if !has_ca => Verify::Nothing,
        SslMode::Disable | SslMode::Prefer | SslMode::Require | SslMode::VerifyCa => Verify::Chain,
        SslMode::VerifyFull => Verify::ChainAndHost,
    };
    let connector = match tls {
        // The files are read whatever the mode: a path that is wrong is wrong with `disable`
        // too.
        Some(tls) => Some(RustlsConnect::new(verify, tls)?),
        None if mode == SslMode::Disable => None,
        None => Some(RustlsConnect::new(verify, &TlsConfig::default())?),
    };
    Ok(Settled {
        url,
        mode,
        connector: connector.filter(|_| mode != SslMode::Disable),
        verify,
    })
}

#[cfg(test)]
pub(super) const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBozCCAUmgAwIBAgIUczkbgDXaFDRrhckvyRd67CJkidUwCgYIKoZIzj0EAwIw
HjEcMBoGA1UEAwwTcmlmZmxlIHVuaXQtdGVzdCBDQTAgFw0yNjEyMDIxMDQxMzVa
GA8yMTI2MTEwODEwNDEzNVowHjEcMBoGA1UEAwwTcmlmZmxlIHVuaXQtdGVzdCBD
QTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABChRf3gqLfEoFfMutoiu5JC9MLW+
evyEMAv6oQYqYpaVRgIHzDHpCpHTuWMVyp1lQwwDC+BTlp15RFp9JA4iOVajYzBh
MB0GA1UdDgQWBBRThNN7XuGzRv3QnAtFNYcg3FQA+jAfBgNVHSMEGDAWgBRThNN7
XuGzRv3QnAtFNYcg3FQA+jAPBgNVHRMBAf8EBTADAQH/MA4GA1UdDwEB/wQEAwIC
BDAKBggqhkjOPQQDAgNIADBFAiEAy3inM1hr4Et1YLVMxZ8FBQMTYQGUFQ1Hv8uA
O1bwL7ICICfW3bKpooIDVoFfS6NHjMZlxNXAJbrZEZ0+wxT/O5pA
-----END CERTIFICATE-----
";

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use super::TEST_CA as CA;

    fn with_ca(dir: &Path) -> TlsConfig {
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, CA).unwrap();
        TlsConfig {
            ca_file: Some(ca),
            ..TlsConfig::default()
        }
    }

    #[test]
    fn a_ca_file_is_read_and_checked_at_set_up() {
        let dir = tempfile::tempdir().unwrap();
        let tls = with_ca(dir.path());
        for verify in [Verify::Nothing, Verify::Chain, Verify::ChainAndHost] {
            let c = RustlsConnect::new(verify, &tls).unwrap();
            assert!(c.trust.contains("ca.pem"), "{}", c.trust);
        }

        let missing = dir.path().join("nope/ca.pem");
        let e = RustlsConnect::new(
            Verify::ChainAndHost,
            &TlsConfig {
                ca_file: Some(missing.clone()),
                ..TlsConfig::default()
            },
        )
        .err()
        .unwrap();
        assert_eq!(e.key, "tls.ca_file");
        assert!(
            e.message.contains(&missing.display().to_string()),
            "the error names the path: {}",
            e.message
        );

        let not_pem = dir.path().join("ca.txt");
        std::fs::write(&not_pem, "hello").unwrap();
        let e = RustlsConnect::new(
            Verify::Chain,
            &TlsConfig {
                ca_file: Some(not_pem),
                ..TlsConfig::default()
            },
        )
        .err()
        .unwrap();
        assert!(e.message.contains("no PEM certificate"), "{}", e.message);
    }

    #[test]
    fn a_client_certificate_needs_its_key_and_both_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let mut tls = with_ca(dir.path());
        tls.client_cert = tls.ca_file.clone();
        let e = RustlsConnect::new(Verify::ChainAndHost, &tls)
            .err()
            .unwrap();
        assert!(e.message.contains("go together"), "{}", e.message);

        tls.client_key = Some(PathBuf::from("/nonexistent/client.key"));
        let e = RustlsConnect::new(Verify::ChainAndHost, &tls)
            .err()
            .unwrap();
        assert_eq!(e.key, "tls.client_key");
        assert!(
            e.message.contains("/nonexistent/client.key"),
            "{}",
            e.message
        );
    }
}
