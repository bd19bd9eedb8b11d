//! The HTTP side: hyper (HTTP/1.1) on a one-thread tokio runtime of the viewer's own, the
//! token check every request passes first, the routes, the page's assets.
//!
//! Requests that read trees run on threads of their own, at most [`WORKERS`] at once: the
//! engine's reads block (a local tree's are plain file reads), and the event loop must keep
//! answering the page meanwhile.

use crate::sources::{ApiError, ApiResult, State};
use crate::{compare, data, listing};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::Value;
use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::Arc;
use tokio::sync::{oneshot, Semaphore};

/// How the CLI begins an error's message (`treepack: error: …`), and so every error of the API.
const CLI_PREFIX: &str = "treepack: error: ";

/// Reads of trees running at once (the machines this runs on may have two cores).
const WORKERS: usize = 4;

/// The page and its assets, compiled in: no CDN, no network at run time.
const INDEX_HTML: &str = include_str!("../assets/index.html");
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("app.js", "text/javascript; charset=utf-8", include_bytes!("../assets/app.js")),
    ("core.js", "text/javascript; charset=utf-8", include_bytes!("../assets/core.js")),
    ("plots.js", "text/javascript; charset=utf-8", include_bytes!("../assets/plots.js")),
    ("leaf.js", "text/javascript; charset=utf-8", include_bytes!("../assets/leaf.js")),
    ("compare.js", "text/javascript; charset=utf-8", include_bytes!("../assets/compare.js")),
    ("app.css", "text/css; charset=utf-8", include_bytes!("../assets/app.css")),
    ("uPlot.iife.min.js", "text/javascript; charset=utf-8", include_bytes!("../assets/vendor/uplot/uPlot.iife.min.js")),
    ("uPlot.min.css", "text/css; charset=utf-8", include_bytes!("../assets/vendor/uplot/uPlot.min.css")),
];

/// A fresh random token: 128 bits from the operating system, as hex.
pub(crate) fn new_token() -> treepack::Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| treepack::Error::internal(format!("no random token: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Whether two strings are equal, in a time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serve on `listener` until `stop` fires (or its sender is dropped).
pub(crate) fn serve(listener: TcpListener, state: Arc<State>, token: String, mut stop: oneshot::Receiver<()>) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_io().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("treepack view: cannot start the server: {e}");
            return;
        }
    };
    let token: Arc<str> = token.into();
    let workers = Arc::new(Semaphore::new(WORKERS));
    rt.block_on(async move {
        let listener = match listener.set_nonblocking(true).and_then(|_| tokio::net::TcpListener::from_std(listener)) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("treepack view: cannot listen: {e}");
                return;
            }
        };
        loop {
            let (stream, _) = tokio::select! {
                _ = &mut stop => return,
                r = listener.accept() => match r {
                    Ok(x) => x,
                    // A connection that failed before it was accepted is the client's problem.
                    Err(_) => continue,
                },
            };
            let (state, token, workers) = (state.clone(), token.clone(), workers.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let (state, token, workers) = (state.clone(), token.clone(), workers.clone());
                    async move { Ok::<_, std::convert::Infallible>(respond(req, state, &token, workers).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            });
        }
    });
}

/// A request's query parameters.
pub(crate) struct Query(HashMap<String, String>);

impl Query {
    fn parse(q: Option<&str>) -> Query {
        Query(form_urlencoded::parse(q.unwrap_or("").as_bytes()).into_owned().collect())
    }
    fn get(&self, k: &str) -> &str {
        self.0.get(k).map_or("", String::as_str)
    }
    /// A number parameter: `default` when absent, a 400 when not a number.
    fn num(&self, k: &str, default: u64) -> ApiResult<u64> {
        match self.0.get(k) {
            None => Ok(default),
            Some(s) => s.parse().map_err(|_| ApiError::bad(format!("parameter `{k}` must be a number, not `{s}`"))),
        }
    }
}

async fn respond(
    req: Request<Incoming>,
    state: Arc<State>,
    token: &str,
    workers: Arc<Semaphore>,
) -> Response<Full<Bytes>> {
    let q = Query::parse(req.uri().query());
    // The token first: without it, nothing else is said (not even whether a path exists).
    if !same(q.get("token"), token) {
        return text(
            StatusCode::FORBIDDEN,
            "forbidden: this viewer answers only requests carrying its token: open the URL `treepack view` printed",
        );
    }
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "the viewer answers GET requests only");
    }
    let path = req.uri().path().to_string();
    if path == "/" || path == "/index.html" {
        return page(INDEX_HTML.replace("{{TOKEN}}", token));
    }
    if let Some(name) = path.strip_prefix("/assets/") {
        return match ASSETS.iter().find(|(n, _, _)| *n == name) {
            Some((_, mime, body)) => with_headers(StatusCode::OK, mime, Bytes::from_static(body)),
            None => text(StatusCode::NOT_FOUND, "no such asset"),
        };
    }
    let Some(endpoint) = path.strip_prefix("/api/").map(str::to_string) else {
        return text(StatusCode::NOT_FOUND, "not found");
    };
    // The read itself on a thread of its own (see the module's doc).
    let Ok(_permit) = workers.acquire_owned().await else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "the viewer is shutting down");
    };
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new().name("treepack-view-read".into()).spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| api(&state, &endpoint, &q)));
        let _ = tx.send(r.unwrap_or_else(|_| {
            Err(ApiError { status: 500, message: "internal error in treepack's viewer; please report it".into() })
        }));
    });
    if spawned.is_err() {
        return text(StatusCode::SERVICE_UNAVAILABLE, "cannot start a thread for this request");
    }
    match rx.await {
        Ok(Ok(Reply::Json(v))) => with_headers(StatusCode::OK, "application/json", Bytes::from(v.to_string())),
        Ok(Ok(Reply::Media(mime, body))) => with_headers(StatusCode::OK, mime, Bytes::from(body)),
        Ok(Err(e)) => {
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            // Every error worded as the CLI words its errors, whether the engine or the viewer
            // refused the request.
            let message =
                if e.message.starts_with(CLI_PREFIX) { e.message } else { format!("{CLI_PREFIX}{}", e.message) };
            let body = serde_json::json!({"error": message, "status": e.status}).to_string();
            with_headers(status, "application/json", Bytes::from(body))
        }
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "the request's thread ended without an answer"),
    }
}

enum Reply {
    Json(Value),
    Media(&'static str, Vec<u8>),
}

/// The JSON API (docs/view.md lists it). `t` names the tree (`a`, `b`, `@NAME`).
fn api(s: &State, endpoint: &str, q: &Query) -> ApiResult<Reply> {
    let tree = || s.tree(q.get("t"));
    let path = q.get("path");
    let limit = |d: u64, max: u64| -> ApiResult<usize> { Ok(q.num("limit", d)?.min(max) as usize) };
    Ok(Reply::Json(match endpoint {
        "info" => listing::info(s)?,
        "children" => listing::children(&*tree()?, path, q.num("offset", 0)? as usize, limit(500, 5000)?)?,
        "node" => listing::details(&*tree()?, path, q.get("hash") != "0")?,
        "search" => listing::search(&*tree()?, q.get("glob"), limit(500, 5000)?)?,
        "slice" => data::slice(&*tree()?, path, q.get("slice"), q.num("max", 1024)?)?,
        "stats" => data::stats(&*tree()?, path, q.num("bins", 64)?)?,
        "values" => data::values(&*tree()?, path, q.get("slice"))?,
        "frame" => crate::frame::frame(
            &*tree()?,
            path,
            q.num("offset", 0)?,
            q.num("limit", 50)?,
            q.num("col_offset", 0)?,
            q.num("col_limit", 50)?,
        )?,
        "io" => data::io(&*tree()?),
        "text" => data::text(&*tree()?, path, q.num("limit", 65536)?)?,
        "image" => {
            let (mime, body) = data::image(&*tree()?, path, q.get("slice"), q.num("max", 1024)?)?;
            return Ok(Reply::Media(mime, body));
        }
        "raw" => {
            let (mime, body) = data::raw(&*tree()?, path)?;
            return Ok(Reply::Media(mime, body));
        }
        "diff" => compare::tree_diff(s, q.get("a"), q.get("b"))?,
        "norm" => compare::norm(&*s.tree(q.get("a"))?, &*s.tree(q.get("b"))?, path)?,
        "names" => compare::names(s)?,
        "history" => (*compare::history(s)?).clone(),
        "history_norms" => compare::history_norms(s, path)?,
        _ => return Err(ApiError::not_found(format!("no API endpoint `{endpoint}`"))),
    }))
}

fn page(html: String) -> Response<Full<Bytes>> {
    with_headers(StatusCode::OK, "text/html; charset=utf-8", Bytes::from(html))
}

fn text(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    with_headers(status, "text/plain; charset=utf-8", Bytes::from(format!("{msg}\n")))
}

/// A response with the headers every answer carries: nothing cached (the token is in every
/// URL), no content sniffing, no referrer, and a policy allowing only this origin's scripts.
fn with_headers(status: StatusCode, mime: &str, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_str(mime).unwrap_or(HeaderValue::from_static("application/octet-stream")));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data: blob:; media-src 'self'; style-src 'self' 'unsafe-inline'; \
             connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        ),
    );
    r
}
