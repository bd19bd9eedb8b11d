//! The treepack viewer: `treepack view LOCATION [OTHER]` and `treepack.view(path)`.
//!
//! [`start`] opens the location through the engine's reader (the only way this crate reads
//! anything: nothing outside the location is read), binds a port on 127.0.0.1 and serves, on a
//! thread of its own:
//!
//! - the page (`assets/`, compiled into the binary: no CDN, works offline), and
//! - a JSON API the page calls: tree listings by path, paged, with counts and bytes per subtree
//!   (`listing`); leaf details; array slices downsampled on the server, histograms and stats,
//!   string and bytes previews (`data`); the diff of two trees with per-array change norms and
//!   the history of a repository (`compare`).
//!
//! Every request must carry the random token of the URL [`Server::url`] gives (`?token=`):
//! other users of the machine can reach 127.0.0.1 too, and the token is what keeps the tree
//! theirs to read only if they were given the URL (docs/view.md, "Security").

#![warn(missing_docs)]

mod browser;
mod compare;
mod data;
mod frame;
pub mod html;
mod http;
mod listing;
mod numeric;
mod sources;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use treepack::{Error, Result, StorageOptions};

/// How [`start`] serves.
#[derive(Debug, Clone, Default)]
pub struct ViewOptions {
    /// The port to listen on (0: one the system picks).
    pub port: u16,
    /// Storage options for remote locations (credentials, endpoint, tuning).
    pub storage: StorageOptions,
}

/// A running viewer. Dropping it stops the server, as [`Server::close`] does.
pub struct Server {
    url: String,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The private folder of the page that sends the browser to the URL ([`Server::open_browser`]).
    launcher: Option<std::path::PathBuf>,
}

impl Server {
    /// The page's address with its token: `http://127.0.0.1:PORT/?token=…`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop serving and wait for the server's thread to end (requests still being answered are
    /// dropped). Calling it twice is harmless.
    pub fn close(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(d) = self.launcher.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// Open the page in the user's browser (`$BROWSER`, else the system's opener).
    ///
    /// The browser is given a file, readable by this user only, that redirects to the URL,
    /// rather than the URL itself: a command line is visible to every user of the machine
    /// (`ps`), and the token must not be.
    ///
    /// # Errors
    /// When the file cannot be written or no opener can be started.
    pub fn open_browser(&mut self) -> std::io::Result<()> {
        let dir = match &self.launcher {
            Some(d) => d.clone(),
            None => {
                let d = private_dir()?;
                self.launcher = Some(d.clone());
                d
            }
        };
        let file = dir.join("open.html");
        let html = format!(
            "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=\"0;url={0}\">\
             <title>treepack view</title><p><a href=\"{0}\">open the treepack viewer</a>",
            self.url
        );
        std::fs::write(&file, html)?;
        browser::open(&file)
    }

    /// Serve until the process ends (what `treepack view` does after printing the URL).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.close();
    }
}

/// The subtree at `path` of the tree `reader` reads, as a compact HTML fragment with at most
/// `max_rows` rows (what notebooks show for `treepack.open(...)`; see [`html`]).
///
/// # Errors
/// [`Error::KeyNotFound`] when `path` is not in the tree.
pub fn reader_html(reader: &treepack::Reader, path: &str, max_rows: usize) -> Result<String> {
    let node = reader.entry(path)?;
    let title = if path.is_empty() { "<root>" } else { path };
    Ok(html::tree_html(node, title, max_rows))
}

/// Open `location` (and `other`, to compare with it) and serve the viewer for them.
///
/// `location` is anything [`treepack::Location::parse_with`] opens — a tree (directory, `.tpk`,
/// object store, `LOCATION@NAME`, a foreign checkpoint read as a tree) or a repository, whose
/// trees and history the page then shows.
///
/// # Errors
/// The error opening either location, as the CLI would report it; an I/O error when the port
/// cannot be bound.
pub fn start(location: &str, other: Option<&str>, opts: &ViewOptions) -> Result<Server> {
    let state = Arc::new(sources::State::open(location, other, &opts.storage)?);
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, opts.port))
        .map_err(|e| Error::Io { path: format!("127.0.0.1:{}", opts.port).into(), source: e })?;
    let addr = listener.local_addr().map_err(|e| Error::Io { path: "127.0.0.1".into(), source: e })?;
    let token = http::new_token()?;
    let url = format!("http://{addr}/?token={token}");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("treepack-view".into())
        .spawn(move || http::serve(listener, state, token, stop_rx))
        .map_err(|e| Error::internal(format!("cannot start the viewer's thread: {e}")))?;
    Ok(Server { url, addr, stop: Some(stop_tx), thread: Some(thread), launcher: None })
}

/// A fresh folder under the temporary directory that only this user may read.
fn private_dir() -> std::io::Result<std::path::PathBuf> {
    let name = format!("treepack-view-{}-{}", std::process::id(), http::new_token().map_err(std::io::Error::other)?);
    let dir = std::env::temp_dir().join(name);
    let mut b = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(&dir)?;
    Ok(dir)
}
