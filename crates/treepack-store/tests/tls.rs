//! HTTPS end to end: the object-store clients speak TLS through rustls with ring as its crypto
//! provider (Cargo.toml builds reqwest with no provider of its own; `object/cloud.rs` installs
//! ring's). Before a client is built no provider exists, so a missing install would panic here,
//! not fail quietly. The server is an HTTPS static server in this process (rustls, a self-signed
//! P-256 certificate for 127.0.0.1 in tests/support, valid until 2126).

use bytes::Bytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use treepack_store::{Location, StorageOptions};

const OBJECTS: [(&str, &[u8]); 2] = [("/w/a/x", b"hello world"), ("/w/empty", b"")];

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap().block_on(f)
}

/// Serves `OBJECTS` over HTTPS on 127.0.0.1 (GET, HEAD, one `Range: bytes=a-b`) until the test
/// process ends; returns the port. Each connection answers one request and closes.
fn https_server() -> u16 {
    let support = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support");
    let cert = CertificateDer::from_pem_file(support.join("tls-cert.pem")).unwrap();
    let key = PrivateKeyDer::from_pem_file(support.join("tls-key.pem")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let conn = rustls::ServerConnection::new(config.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            // A client that refuses the certificate ends the handshake: no request follows.
            let _ = answer(&mut tls);
        }
    });
    port
}

fn answer(s: &mut (impl Read + Write)) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut words = head.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let range = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        let (a, b) = k.eq_ignore_ascii_case("range").then_some(v.trim().strip_prefix("bytes=")?.split_once('-')?)?;
        Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()))
    });
    let reply = match OBJECTS.iter().find(|(p, _)| *p == path) {
        None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
        Some((_, data)) => {
            let (status, body, extra) = match range {
                Some((a, b)) => {
                    let end = b.map_or(data.len(), |b| (b + 1).min(data.len()));
                    let extra = format!("Content-Range: bytes {a}-{}/{}\r\n", end - 1, data.len());
                    ("206 Partial Content", &data[a..end], extra)
                }
                None => ("200 OK", *data, String::new()),
            };
            let mut r =
                format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n", body.len())
                    .into_bytes();
            if method == "GET" {
                r.extend_from_slice(body);
            }
            r
        }
    };
    s.write_all(&reply)?;
    s.flush()
}

fn options(pairs: &[(&str, &str)]) -> StorageOptions {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn https_reads_through_rustls_and_ring() {
    let port = https_server();
    let url = format!("https://127.0.0.1:{port}/w");
    // The certificate is self-signed, so the client is told to accept it.
    let loc = Location::parse_with(&url, &options(&[("allow_invalid_certificates", "true")])).unwrap();
    let got = run(loc.get_opt("a/x", 100)).unwrap();
    assert_eq!(got.as_deref(), Some(&b"hello world"[..]));
    assert_eq!(run(loc.read_range("a/x", 6..11)).unwrap().as_ref(), b"world");
    assert_eq!(run(loc.size("a/x")).unwrap(), 11);
    assert_eq!(run(loc.get_opt("missing", 100)).unwrap(), None);
    let e = run(loc.put("new", vec![Bytes::from_static(b"x")], false)).unwrap_err();
    assert_eq!(e.kind(), "read_only", "{e}");

    // Without that option the certificate is refused: an error that says so, not a panic.
    // (No retries: a refused certificate counts as a failed connection, which is retried.)
    let strict = Location::parse_with(&url, &options(&[("max_retries", "0")])).unwrap();
    let e = run(strict.get_opt("a/x", 100)).unwrap_err();
    let text = format!("{e}");
    assert!(text.contains(&url) || text.contains("127.0.0.1"), "the error names the location: {text}");
    assert!(text.contains("invalid peer certificate"), "the error says why (reqwest's cause): {text}");
    assert!(text.contains("allow_invalid_certificates=true"), "and what to do: {text}");

    // The causes of other failures reach the message too: here, nothing listening. No
    // certificate was refused, whatever the location's name says.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let none = format!("https://127.0.0.1:{closed}/certificates");
    let loc = Location::parse_with(&none, &options(&[("max_retries", "0")])).unwrap();
    let text = run(loc.get_opt("a/x", 100)).unwrap_err().to_string();
    assert!(text.contains("Connection refused"), "{text}");
    assert!(!text.contains("allow_invalid_certificates"), "no certificate hint where none was refused: {text}");
}
