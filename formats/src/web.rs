//! What the HTTP clients (the schema registry's, the `http` sink's) share: which failures are
//! worth a retry, reading a CA file, and a URL fit for logs.

use ureq::tls::{Certificate, PemItem};

/// Connection failures, timeouts and cut-off responses may pass; TLS and protocol misuse won't.
pub fn retryable(error: &ureq::Error) -> bool {
    match error {
        // rustls reports certificate and handshake failures as InvalidData.
        ureq::Error::Io(e) => e.kind() != std::io::ErrorKind::InvalidData,
        ureq::Error::Timeout(_)
        | ureq::Error::ConnectionFailed
        | ureq::Error::HostNotFound
        | ureq::Error::Protocol(_) => true,
        _ => false,
    }
}

/// The certificates of a CA PEM file, each checked to be a usable trust anchor; the error
/// names the path, what is wrong and what was expected.
pub fn read_ca_file(path: &std::path::Path) -> Result<Vec<Certificate<'static>>, String> {
    let bad = |why: String| {
        format!(
            "{}: {why}; expected a PEM file with the CA certificate",
            path.display()
        )
    };
    let pem = std::fs::read(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        // A key beside the certificate is skipped: not ours to use.
        if let PemItem::Certificate(cert) =
            item.map_err(|e| bad(format!("is not valid PEM ({e})")))?
        {
            // ureq's TLS set-up skips certificates it cannot parse; fail here instead.
            rustls::RootCertStore::empty()
                .add(rustls_pki_types::CertificateDer::from(cert.der().to_vec()))
                .map_err(|e| bad(format!("holds a certificate that cannot be used ({e})")))?;
            certs.push(cert);
        }
    }
    if certs.is_empty() {
        return Err(bad(
            "holds no certificate (-----BEGIN CERTIFICATE-----)".into()
        ));
    }
    Ok(certs)
}

/// `url` with the user information's password (and any query, which may carry one) hidden.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<a URL without `scheme://`>".to_string();
    };
    let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_string(),
    };
    let query = if url.contains('?') { "?…" } else { "" };
    format!("{scheme}://{authority}{path}{query}")
}
