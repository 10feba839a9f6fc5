//! TLS for the PostgreSQL connections, as libpq reads it from the URL: `sslmode` (`disable`,
//! `allow`, `prefer`, `require`, `verify-ca`, `verify-full`) and `sslrootcert` (a PEM file of
//! CA certificates, or `system`). tokio-postgres knows only the first three modes, so both
//! parameters are taken off the URL here and the rest is left to it.
//!
//! | `sslmode` | encrypted | server checked |
//! |---|---|---|
//! | `disable` | no | — |
//! | `allow`, `prefer` (the default) | if the server offers TLS | no (as libpq) |
//! | `require` | yes | no; with a root certificate given, as `verify-ca` (as libpq) |
//! | `verify-ca` | yes | chain to a trusted root |
//! | `verify-full` | yes | chain to a trusted root, and the certificate names the host |
//!
//! Trusted roots: `sslrootcert=<file>`, else [`tls_root_certificate`], else the system's.
//! Without the `postgres-tls` feature, a mode that needs TLS is refused at build.
//!
//! [`tls_root_certificate`]: super::PgBackendBuilder::tls_root_certificate

use tokio_postgres::config::SslMode;

use std::time::Duration;

use crate::backend::retry::Failure;
use crate::error::{Error, Result};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS settings of one URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Settings {
    pub(super) mode: Mode,
    /// `sslrootcert`: a file, or `system`.
    pub(super) root: Option<String>,
}

impl Settings {
    /// The mode tokio-postgres gets: it decides whether TLS is asked for, and whether a
    /// server without it is refused.
    pub(super) fn ssl_mode(&self) -> SslMode {
        match self.mode {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

fn mode_of(value: &str) -> Result<Mode> {
    Ok(match value {
        "disable" => Mode::Disable,
        "allow" | "prefer" => Mode::Prefer,
        "require" => Mode::Require,
        "verify-ca" => Mode::VerifyCa,
        "verify-full" => Mode::VerifyFull,
        other => {
            return Err(Error::invalid_config(format_args!(
                "unknown postgres sslmode `{other}` (disable, allow, prefer, require, verify-ca or verify-full)"
            )))
        }
    })
}

/// `%XX` escapes of a URL query value decoded (a path may carry them).
fn decode(value: &str) -> Result<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::invalid_config("a bad %-escape in the postgres url"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::invalid_config("a postgres url parameter is not UTF-8"))
}

/// Takes `sslmode` and `sslrootcert` off `url` (URL form `postgres://…?sslmode=…`, or the
/// `key=value` form, in any spelling libpq takes: spaces around `=`, quoted values, `%`-escaped
/// URL keys): returns the rest of the URL, untouched, and the settings, `None` for a mode the
/// URL did not give.
pub(super) fn split(url: &str) -> Result<(String, Option<Mode>, Option<String>)> {
    let (mut mode, mut root) = (None, None);
    let mut take = |key: &str, value: &str| -> Result<bool> {
        match key {
            "sslmode" => mode = Some(mode_of(value)?),
            "sslrootcert" => root = Some(value.to_owned()),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    if !take(&decode(key)?, &decode(value)?)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        // Cut our two parameters out by their place; everything else stays byte for byte (a
        // quoted value may hold runs of spaces).
        let mut rest = String::with_capacity(url.len());
        let mut from = 0;
        for (key, value, span) in conninfo(url) {
            if take(key, &value)? {
                rest.push_str(&url[from..span.start]);
                from = span.end;
            }
        }
        rest.push_str(&url[from..]);
        rest
    };
    Ok((rest, mode, root))
}

/// The `key = value` pairs of a libpq connection string, each with its place in `s`: keys up to
/// whitespace or `=`, values bare (up to whitespace) or single-quoted, `\` escaping the next
/// character in either. Stops at the first thing that is not a pair (tokio-postgres, which
/// reads the whole string, then says what is wrong).
fn conninfo(s: &str) -> Vec<(&str, String, std::ops::Range<usize>)> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if i >= b.len() {
            return out;
        }
        let start = i;
        while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'=' {
            i += 1;
        }
        let key = &s[start..i];
        i = skip_ws(i);
        if i >= b.len() || b[i] != b'=' || key.is_empty() {
            return out;
        }
        i = skip_ws(i + 1);
        let mut value = Vec::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            loop {
                match b.get(i) {
                    None => return out,
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < b.len() => {
                        value.push(b[i + 1]);
                        i += 2;
                    }
                    Some(&c) => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                value.push(b[i]);
                i += 1;
            }
        }
        out.push((key, String::from_utf8_lossy(&value).into_owned(), start..i));
    }
}

/// The settings for a URL: what it said, else what tokio-postgres read of it (`parsed`, the
/// spellings it knows), else libpq's default `prefer`.
pub(super) fn settings(mode: Option<Mode>, root: Option<String>, parsed: SslMode) -> Settings {
    let mut mode = mode.unwrap_or(match parsed {
        SslMode::Disable => Mode::Disable,
        SslMode::Prefer => Mode::Prefer,
        // `Require`, and whatever mode tokio-postgres may add: encrypted at least.
        _ => Mode::Require,
    });
    if mode == Mode::Require && root.is_some() {
        // libpq: `require` with a root certificate checks the chain, as `verify-ca`.
        mode = Mode::VerifyCa;
    }
    Settings { mode, root }
}

/// Where and how to connect: tokio-postgres' settings and the TLS connector that goes with
/// them.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) tls: Connector,
}

/// The connection half of [`Endpoint::connect`], to drive in a task.
pub(crate) type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <Connector as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

impl Endpoint {
    /// Opens a connection: the TCP connect, TLS, the startup and authentication exchange, all
    /// within the connect timeout (the URL's `connect_timeout`, else the default set when the
    /// URL was read). tokio-postgres bounds only the TCP connect by it, so a server that
    /// accepts and never answers (hung, or a balancer with no backend) would hang it for ever.
    pub(crate) async fn connect(
        &self,
    ) -> std::result::Result<(tokio_postgres::Client, Connection), Failure<tokio_postgres::Error>>
    {
        // `NoTls` is `Copy` in a build without TLS; the rustls connector is not.
        #[allow(clippy::clone_on_copy)]
        let tls = self.tls.clone();
        match tokio::time::timeout(self.connect_timeout(), self.config.connect(tls)).await {
            Ok(connected) => connected.map_err(Failure::Call),
            Err(_) => Err(Failure::Timeout),
        }
    }

    /// How long [`connect`](Self::connect) may take.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.config
            .get_connect_timeout()
            .copied()
            .unwrap_or(super::commands::CALL_TIMEOUT)
    }
}

/// What a connection is made with: TLS as the settings say (feature `postgres-tls`).
#[cfg(feature = "postgres-tls")]
pub(crate) type Connector = tokio_postgres_rustls::MakeRustlsConnect;

/// What a connection is made with: no TLS in this build.
#[cfg(not(feature = "postgres-tls"))]
pub(crate) type Connector = tokio_postgres::NoTls;

/// The connector for `settings`, trusting `root_pem` (PEM) where the URL names no root file.
#[cfg(not(feature = "postgres-tls"))]
pub(super) fn connector(settings: &Settings, root_pem: Option<&[u8]>) -> Result<Connector> {
    let _ = root_pem;
    match settings.mode {
        Mode::Disable | Mode::Prefer => Ok(tokio_postgres::NoTls),
        _ => Err(Error::invalid_config(
            "this postgres sslmode needs TLS: build distlock with the `postgres-tls` feature",
        )),
    }
}

/// The connector for `settings`, trusting `root_pem` (PEM) where the URL names no root file.
#[cfg(feature = "postgres-tls")]
pub(super) fn connector(settings: &Settings, root_pem: Option<&[u8]>) -> Result<Connector> {
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::ClientConfig;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid_config("postgres tls").with_source(e))?;
    let config = match settings.mode {
        Mode::VerifyFull => {
            let roots = Arc::new(roots(settings, root_pem)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| Error::invalid_config("postgres tls roots").with_source(e))?;
            builder.with_webpki_verifier(webpki).with_no_client_auth()
        }
        // libpq's weaker checks: the chain alone (`verify-ca`), or none (`require`, `prefer`).
        mode => {
            let chain = match mode {
                Mode::VerifyCa => Some(
                    WebPkiServerVerifier::builder_with_provider(
                        Arc::new(roots(settings, root_pem)?),
                        provider.clone(),
                    )
                    .build()
                    .map_err(|e| Error::invalid_config("postgres tls roots").with_source(e))?,
                ),
                _ => None,
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verify::Libpq { provider, chain }))
                .with_no_client_auth()
        }
    };
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// The trusted roots: the URL's `sslrootcert` file (`system`: the system's), else `root_pem`,
/// else the system's.
#[cfg(feature = "postgres-tls")]
fn roots(settings: &Settings, root_pem: Option<&[u8]>) -> Result<rustls::RootCertStore> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    let pem = match settings.root.as_deref() {
        Some("system") => None,
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            Error::invalid_config(format_args!("cannot read postgres sslrootcert `{path}`"))
                .with_source(e)
        })?),
        None => root_pem.map(<[u8]>::to_vec),
    };
    let mut store = rustls::RootCertStore::empty();
    match pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    Error::invalid_config("a postgres root certificate is not valid PEM")
                        .with_source(e)
                })?;
                store.add(cert).map_err(|e| {
                    Error::invalid_config("a postgres root certificate is unusable").with_source(e)
                })?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // One unusable system certificate does not make the others unusable.
                let _ = store.add(cert);
            }
        }
    }
    if store.is_empty() {
        return Err(Error::invalid_config(
            "no trusted root certificate for postgres tls (sslrootcert, tls_root_certificate or the system's)",
        ));
    }
    Ok(store)
}

/// The two checks libpq makes that rustls' own verifier does not: the chain alone
/// (`verify-ca`) and none (`require`, `prefer`). Handshake signatures are always checked.
#[cfg(feature = "postgres-tls")]
mod verify {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

    /// `chain`: the certificate must chain to a trusted root, whatever name it carries
    /// (`verify-ca`); `None`: encryption without authentication (`require`, `prefer`).
    #[derive(Debug)]
    pub(super) struct Libpq {
        pub(super) provider: Arc<CryptoProvider>,
        pub(super) chain: Option<Arc<WebPkiServerVerifier>>,
    }

    impl ServerCertVerifier for Libpq {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            let Some(chain) = &self.chain else {
                return Ok(ServerCertVerified::assertion());
            };
            match chain.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
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
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
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
                &self.provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_parameters_are_taken_off_the_url() {
        let (rest, mode, root) = split(
            "postgres://u@h:5432/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@h:5432/db?application_name=x");
        assert_eq!(mode, Some(Mode::VerifyFull));
        assert_eq!(root.as_deref(), Some("/tmp/ca.pem"));

        let (rest, mode, _) = split("postgres://u@h/db").unwrap();
        assert_eq!((rest.as_str(), mode), ("postgres://u@h/db", None));

        let (rest, mode, _) = split("postgres://u@h/db?ssl%6Dode=require").unwrap();
        assert_eq!(
            (rest.as_str(), mode),
            ("postgres://u@h/db", Some(Mode::Require))
        );

        let (rest, mode, root) =
            split("postgres://u@h/db?sslmode=require&sslrootcert=ca.pem").unwrap();
        assert_eq!(rest, "postgres://u@h/db");
        let s = settings(mode, root, SslMode::Prefer);
        assert_eq!(s.mode, Mode::VerifyCa);

        // Every spelling libpq takes; the rest of the string stays byte for byte.
        for (url, want, left) in [
            (
                "host=h user=u sslmode=verify-ca dbname=d",
                Mode::VerifyCa,
                "host=h user=u  dbname=d",
            ),
            ("host=h sslmode = require", Mode::Require, "host=h "),
            (
                "host=h sslmode='verify-full' application_name='a  b'",
                Mode::VerifyFull,
                "host=h  application_name='a  b'",
            ),
            ("sslmode= disable host=h", Mode::Disable, " host=h"),
        ] {
            let (rest, mode, _) = split(url).unwrap();
            assert_eq!((rest.as_str(), mode), (left, Some(want)), "{url}");
        }
        let (_, _, root) = split(r"host=h sslrootcert='/a b/c\'d.pem'").unwrap();
        assert_eq!(root.as_deref(), Some("/a b/c'd.pem"));

        // tokio-postgres' own reading counts where the URL gave nothing we read.
        assert_eq!(settings(None, None, SslMode::Require).mode, Mode::Require);
        assert_eq!(settings(None, None, SslMode::Disable).mode, Mode::Disable);
        assert_eq!(settings(None, None, SslMode::Prefer).mode, Mode::Prefer);

        for bad in [
            "postgres://h/db?sslmode=strict",
            "postgres://h/db?sslrootcert=%zz",
            "host=h sslmode=strict",
        ] {
            assert!(split(bad).unwrap_err().is_invalid_config(), "{bad}");
        }
    }
}
