//! `treepack view`'s server, driven over HTTP as the page drives it: the token every request
//! needs, listings of the demo tree, known slice values, slice bounds and caps, paths outside
//! the tree, diffs and a repository's history. The page itself is tested in a real browser by
//! python/tests/test_view_browser.py.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use treepack::{ArrayData, DType, Node, SaveOptions, Tree};

/// A `treepack view --no-browser` process, killed when dropped.
struct Viewer {
    child: Child,
    /// The server's stdout, kept open (the rest of it is not read).
    _stdout: BufReader<std::process::ChildStdout>,
    addr: String,
    token: String,
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn treepack() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin!("treepack"))
}

/// Start the viewer on `args` and read the URL it prints.
fn view(args: &[&str]) -> Viewer {
    let mut child = treepack()
        .arg("view")
        .args(args)
        .arg("--no-browser")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start treepack view");
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    stdout.read_line(&mut line).expect("read the URL line");
    let url =
        line.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_else(|| panic!("no URL in {line:?}"));
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, query) = rest.split_once("/?token=").expect("a token in the URL");
    assert!(addr.starts_with("127.0.0.1:"), "serves on loopback only: {url}");
    assert_eq!(query.len(), 32, "a 128-bit token: {url}");
    Viewer { child, _stdout: stdout, addr: addr.to_string(), token: query.to_string() }
}

/// Percent-encode a query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// GET `target` (path and query) with a plain HTTP/1.1 request: (status, body).
fn get_raw(addr: &str, target: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(s, "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status");
    (status, body.to_string())
}

impl Viewer {
    /// GET an API endpoint with the token and `params`: (status, JSON body).
    fn api(&self, endpoint: &str, params: &[(&str, &str)]) -> (u16, Value) {
        let mut q = format!("token={}", self.token);
        for (k, v) in params {
            q.push_str(&format!("&{k}={}", enc(v)));
        }
        let (status, body) = get_raw(&self.addr, &format!("/api/{endpoint}?{q}"));
        (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{endpoint}: not JSON ({e}): {body}")))
    }

    fn ok(&self, endpoint: &str, params: &[(&str, &str)]) -> Value {
        let (status, v) = self.api(endpoint, params);
        assert_eq!(status, 200, "{endpoint} {params:?}: {v}");
        v
    }

    /// The error message of a request expected to fail with `status`.
    fn err(&self, endpoint: &str, params: &[(&str, &str)], status: u16) -> String {
        let (got, v) = self.api(endpoint, params);
        assert_eq!(got, status, "{endpoint} {params:?}: {v}");
        assert_eq!(v["status"], status, "{v}");
        let m = v["error"].as_str().expect("an error message").to_string();
        assert!(m.starts_with("treepack: error: "), "worded as the CLI's errors: {m}");
        m
    }
}

fn demo(dir: &Path) -> String {
    let p = dir.join("demo").to_str().unwrap().to_string();
    assert!(treepack().args(["demo", &p]).output().unwrap().status.success());
    p
}

fn f32_array(shape: Vec<u64>, f: impl Fn(u64) -> f32) -> Node {
    let n: u64 = shape.iter().product();
    let data: Vec<u8> = (0..n).flat_map(|i| f(i).to_le_bytes()).collect();
    Node::from(ArrayData::new(DType::F32, shape, data).unwrap())
}

#[test]
fn every_request_needs_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let v = view(&[&demo(tmp.path())]);
    for target in
        ["/", "/api/info", "/api/children?path=", "/assets/app.js", "/nothing", "/?token=", "/api/info?token=0"]
    {
        let (status, body) = get_raw(&v.addr, target);
        assert_eq!(status, 403, "{target}: {body}");
        assert!(!body.contains("params"), "a 403 says nothing of the tree: {body}");
    }
    // A token of the right length but wrong.
    let wrong: String = v.token.chars().map(|c| if c == '0' { '1' } else { '0' }).collect();
    assert_eq!(get_raw(&v.addr, &format!("/api/info?token={wrong}")).0, 403);
    // With it: the page, its assets (the vendored uPlot among them) and the API.
    let (status, page) = get_raw(&v.addr, &format!("/?token={}", v.token));
    assert_eq!(status, 200);
    assert!(page.contains(&format!("/assets/app.js?token={}", v.token)), "assets carry the token");
    assert!(!page.contains("http://") && !page.contains("https://"), "no CDN: {page}");
    let (status, js) = get_raw(&v.addr, &format!("/assets/uPlot.iife.min.js?token={}", v.token));
    assert!(status == 200 && js.contains("uPlot"));
    assert_eq!(get_raw(&v.addr, &format!("/api/nothing?token={}", v.token)).0, 404);
}

#[test]
fn the_demo_tree_lists_with_counts_and_reads_a_known_slice() {
    let tmp = tempfile::tempdir().unwrap();
    let v = view(&[&demo(tmp.path())]);
    let info = v.ok("info", &[]);
    assert_eq!(info["tree"], true);
    assert_eq!(info["totals"]["leaves"], 41);
    let root = v.ok("children", &[("path", "")]);
    let names: Vec<&str> = root["children"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["params", "dtypes", "scalars", "history", "config", "custom", "odd_keys"]);
    let params = &root["children"][0];
    assert_eq!(
        (params["kind"].as_str(), params["leaves"].as_u64(), params["arrays"].as_u64()),
        (Some("dict"), Some(3), Some(3))
    );
    // 512*256*4 + 256*4 + 1000*64*2 bytes below params.
    assert_eq!(params["bytes"], 524288 + 1024 + 128000);
    // Pages: offset and limit, with the total.
    let page = v.ok("children", &[("path", "dtypes"), ("offset", "2"), ("limit", "3")]);
    assert_eq!(page["total"], 14);
    assert_eq!(page["children"].as_array().unwrap().len(), 3);
    assert_eq!(page["children"][0]["path"], "dtypes/uint16");
    let node = v.ok("node", &[("path", "params/dense/kernel")]);
    assert_eq!(node["dtype"], "float32");
    assert_eq!(node["shape"], serde_json::json!([512, 256]));
    assert_eq!(node["storage"]["chunk_shape"], serde_json::json!([128, 256]));
    assert_eq!(node["storage"]["chunks"], 4);
    assert_eq!(node["hash"].as_str().unwrap().len(), 64);
    // The root's hash is a walk of the whole tree: the tree list's root row asks without it.
    assert_eq!(v.ok("node", &[("path", "")])["hash"].as_str().map(str::len), Some(64));
    let root_row = v.ok("node", &[("path", ""), ("hash", "0")]);
    assert!(root_row["hash"].is_null() && root_row["leaves"] == 41, "{root_row}");
    // The demo's kernel is ((i % 97) * 0.01 - 0.3) as f32 at flat index i.
    let s = v.ok("slice", &[("path", "params/dense/kernel"), ("slice", "1:3, 10:14")]);
    assert_eq!(s["kind"], "heatmap");
    assert_eq!(s["shape"], serde_json::json!([2, 4]));
    let data: Vec<f64> = s["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    let want: Vec<f64> = [1u64, 2]
        .iter()
        .flat_map(|r| (10..14u64).map(move |c| f64::from(((r * 256 + c) % 97) as f32 * 0.01 - 0.3)))
        .collect();
    for (g, w) in data.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{data:?} vs {want:?}");
    }
    // A 1-D slice: every point when it fits, with the index each came from.
    let line = v.ok("slice", &[("path", "params/dense/bias"), ("slice", "100:103")]);
    assert_eq!(line["x"], serde_json::json!([100, 101, 102]));
    assert!((line["y"][2].as_f64().unwrap() - f64::from(102f32 * 0.001)).abs() < 1e-9);
    // Downsampled to the points asked for, keeping the extremes.
    let small = v.ok("slice", &[("path", "params/dense/kernel"), ("slice", ":, :"), ("max", "16")]);
    assert_eq!(small["shape"], serde_json::json!([16, 16]));
    assert_eq!(small["factor"], serde_json::json!([32, 16]));
    // Stats: the whole array's.
    let st = v.ok("stats", &[("path", "dtypes/float64"), ("bins", "4")]);
    assert_eq!((st["count"].as_u64(), st["nan"].as_u64(), st["posinf"].as_u64()), (Some(4), Some(1), Some(1)));
    // Strings, bytes, elements of any dtype.
    let t = v.ok("text", &[("path", "scalars/name")]);
    assert_eq!(t["text"], "treepack demo ✓");
    let b = v.ok("text", &[("path", "scalars/raw")]);
    assert!(b["hex"].as_str().unwrap().starts_with("00000000  00 01 62 69 6e"));
    let rec = v.ok("values", &[("path", "dtypes/record_dtype"), ("slice", "1:2")]);
    assert_eq!(rec["values"][0]["id"], 1);
    // Glob search.
    let found = v.ok("search", &[("glob", "*kern*")]);
    assert_eq!(found["total"], 1);
    assert_eq!(found["matches"][0]["path"], "params/dense/kernel");
}

#[test]
fn slices_outside_the_array_or_too_big_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let v = view(&[&demo(tmp.path())]);
    let kernel = ("path", "params/dense/kernel");
    let m = v.err("slice", &[kernel, ("slice", "0:600, :")], 400);
    assert!(m.contains("outside the array") && m.contains("axis 0 of length 512"), "{m}");
    let m = v.err("slice", &[kernel, ("slice", "512, :")], 400);
    assert!(m.contains("out of bounds for axis 0"), "{m}");
    let m = v.err("slice", &[kernel, ("slice", "-513:, :")], 400);
    assert!(m.contains("outside the array"), "{m}");
    let m = v.err("slice", &[kernel, ("slice", "0:x")], 400);
    assert!(m.contains("not an integer"), "{m}");
    let m = v.err("slice", &[kernel, ("slice", "0, 0, 0")], 400);
    assert!(m.contains("3 indices for an array with 2 axes"), "{m}");
    let m = v.err("slice", &[("path", "scalars/name"), ("slice", ":")], 400);
    assert!(m.contains("not an array"), "{m}");
    let m = v.err("slice", &[kernel, ("max", "lots")], 400);
    assert!(m.contains("must be a number"), "{m}");
    // Only images and audio are served raw: never a leaf as a page of this origin.
    let m = v.err("raw", &[("path", "scalars/raw")], 400);
    assert!(m.contains("not an image"), "{m}");
    let m = v.err("raw", &[("path", "params/dense/kernel")], 400);
    assert!(m.contains("not a bytes leaf"), "{m}");

    // An array of more elements than one read may take: refused before anything is read,
    // saying what to ask instead; a step brings it under the cap.
    let big = tmp.path().join("big");
    let data = vec![0u8; 4100 * 4100];
    let tree = Node::dict([("img", Node::from(ArrayData::new(DType::U8, vec![4100, 4100], data).unwrap()))]);
    treepack::save(&tree, big.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let v = view(&[big.to_str().unwrap()]);
    let m = v.err("slice", &[("path", "img"), ("slice", ":, :")], 400);
    assert!(m.contains("16810000 elements") && m.contains("at most 16777216") && m.contains("step"), "{m}");
    let ok = v.ok("slice", &[("path", "img"), ("slice", "::2, ::2"), ("max", "64")]);
    // 2050 rows in blocks of 33: 63 rows of at most 64 asked for.
    assert_eq!((&ok["shape"], &ok["factor"]), (&serde_json::json!([63, 63]), &serde_json::json!([33, 33])));
}

#[test]
fn paths_outside_the_tree_are_404() {
    let tmp = tempfile::tempdir().unwrap();
    let v = view(&[&demo(tmp.path())]);
    for (endpoint, path) in [
        ("node", "params/nope"),
        ("children", "nope"),
        ("slice", "params/dense/kernel/deeper"),
        ("stats", "../../etc/passwd"),
        ("text", "/etc/passwd"),
        ("node", "history/7"),
    ] {
        let m = v.err(endpoint, &[("path", path), ("slice", ":")], 404);
        assert!(m.starts_with("treepack: error: key path"), "{endpoint} {path}: {m}");
    }
    // Trees by name exist only in repositories; `b` only with a second location.
    assert!(v.err("children", &[("t", "@step1"), ("path", "")], 400).contains("not a repository"));
    assert!(v.err("children", &[("t", "b"), ("path", "")], 400).contains("no second location"));
}

#[test]
fn two_trees_diff_with_change_norms() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let w = |k: f32| f32_array(vec![4, 4], move |_| k);
    let ta = Node::dict([("w", w(1.0)), ("gone", Node::from(1i64)), ("same", w(5.0))]);
    let tb = Node::dict([("w", w(3.0)), ("new", Node::from("x")), ("same", w(5.0))]);
    treepack::save(&ta, a.to_str().unwrap(), &SaveOptions::default()).unwrap();
    treepack::save(&tb, b.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let v = view(&[a.to_str().unwrap(), b.to_str().unwrap()]);
    let d = v.ok("diff", &[("a", "a"), ("b", "b")]);
    assert_eq!((d["added"].as_u64(), d["removed"].as_u64(), d["changed"].as_u64()), (Some(1), Some(1), Some(1)));
    let w_row = d["rows"].as_array().unwrap().iter().find(|r| r["path"] == "w").unwrap();
    assert_eq!(w_row["norm"], true);
    let n = v.ok("norm", &[("a", "a"), ("b", "b"), ("path", "w")]);
    // |3 - 1| over 16 elements: L2 8, max 2; relative to ‖a‖ = 4: 2.
    assert_eq!((n["l2"].as_f64(), n["linf"].as_f64(), n["rel"].as_f64()), (Some(8.0), Some(2.0), Some(2.0)));
    assert_eq!(n["changed"], 16);
    // Identical chunks are not read.
    assert_eq!(v.ok("norm", &[("a", "a"), ("b", "b"), ("path", "same")])["read"], false);
    // The second tree is browsable too.
    assert_eq!(v.ok("node", &[("t", "b"), ("path", "new")])["summary"], "\"x\"");
}

#[test]
fn a_repository_shows_its_history() {
    let tmp = tempfile::tempdir().unwrap();
    let repo_dir = tmp.path().join("repo");
    let repo = treepack::Repository::create(repo_dir.to_str().unwrap()).unwrap();
    for step in 0..3u8 {
        let t = Node::dict([
            ("w", f32_array(vec![8, 8], move |i| f32::from(step) + i as f32)),
            ("frozen", f32_array(vec![4], |_| 7.0)),
            ("step", Node::from(i64::from(step))),
        ]);
        repo.save(&t, &format!("step{step}"), &SaveOptions::default()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5)); // distinct save times
    }
    let v = view(&[repo_dir.to_str().unwrap()]);
    let info = v.ok("info", &[]);
    assert_eq!(info["tree"], false);
    assert!(info["repository"].as_str().is_some());
    assert!(v.err("children", &[("path", "")], 400).contains("is a repository"));
    let names = v.ok("names", &[]);
    assert_eq!(names["names"].as_array().unwrap().len(), 3);
    let h = v.ok("history", &[]);
    let trees = h["trees"].as_array().unwrap();
    let order: Vec<&str> = trees.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(order, ["step0", "step1", "step2"]);
    assert_eq!((trees[1]["changed"].as_u64(), trees[1]["added"].as_u64()), (Some(2), Some(0)));
    let arrays = h["arrays"].as_array().unwrap();
    assert_eq!(arrays.len(), 1, "only w changed among the arrays: {arrays:?}");
    assert_eq!(arrays[0]["chunks_changed"], serde_json::json!([null, 1.0, 1.0]));
    let norms = v.ok("history_norms", &[("path", "w")]);
    let steps = norms["steps"].as_array().unwrap();
    assert!(steps[0].is_null());
    // Each step adds 1 to all 64 elements: ‖Δ‖ = 8.
    assert_eq!(steps[1]["l2"], 8.0);
    // Trees of the repository by name.
    assert_eq!(v.ok("node", &[("t", "@step2"), ("path", "step")])["value"], "2");
    let m = v.err("node", &[("t", "@nope"), ("path", "")], 404);
    assert!(m.contains("nope"), "{m}");
    // A name is one of the repository's trees, never a path out of it: a tree saved next to the
    // repository is not reachable through it.
    let outside = tmp.path().join("outside");
    treepack::save(&Node::dict([("secret", Node::from(1i64))]), outside.to_str().unwrap(), &SaveOptions::default())
        .unwrap();
    for name in ["@../outside", "@../../outside", "@/etc/passwd", "@step0/../../outside", "@..", "@"] {
        let (status, e) = v.api("children", &[("t", name), ("path", "")]);
        assert!(status == 400 || status == 404, "{name}: {status} {e}");
        assert!(!e.to_string().contains("secret"), "{name}: {e}");
    }

    // `LOCATION@NAME`: that tree, with the repository's others and its history one tab away.
    let v = view(&[&format!("{}@step1", repo_dir.to_str().unwrap())]);
    let info = v.ok("info", &[]);
    assert_eq!((info["tree"].as_bool(), info["totals"]["leaves"].as_u64()), (Some(true), Some(3)));
    assert!(info["repository"].as_str().is_some(), "{info}");
    assert_eq!(v.ok("node", &[("path", "step")])["value"], "1");
    assert_eq!(v.ok("node", &[("t", "@step2"), ("path", "step")])["value"], "2");
    assert_eq!(v.ok("history", &[])["trees"].as_array().unwrap().len(), 3);
}

#[test]
fn a_location_that_does_not_open_fails_as_the_cli_does() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let out = treepack().args(["view", missing.to_str().unwrap(), "--no-browser"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("treepack: error: cannot view") && err.contains("no treepack tree found"), "{err}");
}

#[test]
fn foreign_checkpoints_and_single_files_are_viewed_as_trees() {
    let tmp = tempfile::tempdir().unwrap();
    let d = demo(tmp.path());
    // A safetensors file (read as the flat tree it holds) and a .tpk.
    let st = tmp.path().join("m.safetensors");
    let tpk = tmp.path().join("m.tpk");
    for (dst, extra) in [(&st, vec!["--select", "params/**"]), (&tpk, vec![])] {
        let cmd = if extra.is_empty() { "cp" } else { "convert" };
        let out = treepack().arg(cmd).args([&d, dst.to_str().unwrap()]).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let v = view(&[st.to_str().unwrap()]);
    assert_eq!(v.ok("info", &[])["read_from"], "safetensors file");
    let names: Vec<String> = v.ok("children", &[("path", "")])["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"params.dense.kernel".to_string()), "{names:?}");
    let s = v.ok("slice", &[("path", "params.dense.kernel"), ("slice", "0, 0:2")]);
    assert_eq!(s["y"][0].as_f64().map(|x| (x * 1e6).round() / 1e6), Some(-0.3));
    let v = view(&[tpk.to_str().unwrap()]);
    assert_eq!(v.ok("children", &[("path", "params")])["total"], 2);
}

/// GET `target` and keep the body's bytes: (status, content type, body).
fn get_bytes(addr: &str, target: &str) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(s, "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP response");
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status");
    let mime = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|m| m.trim().to_string()))
        .unwrap_or_default();
    (status, mime, buf[end + 4..].to_vec())
}

/// A PNG's size and colour type, from its header (the pixels are checked by the viewer
/// crate's own tests and in the browser).
fn png_header(bytes: &[u8]) -> (u32, u32, u8) {
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && &bytes[12..16] == b"IHDR", "not a PNG");
    let be = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    (be(16), be(20), bytes[25])
}

#[test]
fn image_shaped_arrays_are_served_as_png() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("img");
    let rgb: Vec<u8> = (0..32u32 * 48).flat_map(|p| [(p % 48 * 5) as u8, (p / 48 * 8) as u8, 7]).collect();
    let grey: Vec<u8> = (0..4096u32 * 64).map(|p| (p % 64) as u8).collect();
    // A WAV file's first bytes (RIFF…WAVE) and a few samples: audio, served as it is stored.
    let wav: Vec<u8> = [&b"RIFF\x24\0\0\0WAVEfmt "[..], &[0u8; 24], b"data\x04\0\0\0\x01\x02\x03\x04"].concat();
    let tree = Node::dict([
        ("rgb", Node::from(ArrayData::new(DType::U8, vec![32, 48, 3], rgb).unwrap())),
        ("tall", Node::from(ArrayData::new(DType::U8, vec![4096, 64], grey).unwrap())),
        ("batch", Node::from(ArrayData::new(DType::U8, vec![2, 2, 2, 4], (0..32u8).collect::<Vec<u8>>()).unwrap())),
        ("w", f32_array(vec![8, 8], |i| i as f32)),
        ("clip", Node::from(wav.clone())),
        ("page", Node::from(b"<html><script>alert(1)</script>".to_vec())),
    ]);
    treepack::save(&tree, dir.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let v = view(&[dir.to_str().unwrap()]);
    // The leaf panel offers the image first for bytes, after the heatmap for other floats.
    assert_eq!(
        v.ok("node", &[("path", "rgb")])["views"],
        serde_json::json!(["image", "heatmap", "histogram", "table"])
    );
    assert_eq!(v.ok("node", &[("path", "w")])["views"], serde_json::json!(["heatmap", "image", "histogram", "table"]));
    let image = |path: &str, slice: &str, max: &str| {
        let q = format!("/api/image?token={}&path={path}&slice={}&max={max}", v.token, enc(slice));
        let (status, mime, body) = get_bytes(&v.addr, &q);
        assert_eq!((status, mime.as_str()), (200, "image/png"), "{path} {slice}: {}", String::from_utf8_lossy(&body));
        png_header(&body)
    };
    // PNG colour types: 0 grey, 2 RGB, 6 RGBA.
    assert_eq!(image("rgb", ":, :, :", "1024"), (48, 32, 2));
    assert_eq!(image("rgb", "2:4, ::16, :", "1024"), (3, 2, 2));
    // Larger than `max` a side: block means, one factor for both axes (proportions kept).
    assert_eq!(image("tall", ":, :", "256"), (4, 256, 0));
    assert_eq!(image("batch", "1, :, :, :", "1024"), (2, 2, 6));
    // Not images: refused, saying why; the token is needed as everywhere.
    let m = v.err("image", &[("path", "rgb"), ("slice", ":, :, 0:2")], 400);
    assert!(m.contains("not an image") && m.contains("colour channels"), "{m}");
    let m = v.err("image", &[("path", "rgb"), ("slice", "0, :, :")], 400);
    assert!(m.contains("not an image"), "{m}");
    let m = v.err("image", &[("path", "rgb"), ("slice", "0:40, :, :")], 400);
    assert!(m.contains("outside the array"), "{m}");
    let m = v.err("image", &[("path", "rgb"), ("slice", "0:0, :, :")], 400);
    assert!(m.contains("empty"), "{m}");
    assert_eq!(get_bytes(&v.addr, "/api/image?path=rgb&slice=:,:,:").0, 403);
    // Bytes leaves: audio (and images) raw, as stored; markup never.
    let (status, mime, body) = get_bytes(&v.addr, &format!("/api/raw?token={}&path=clip", v.token));
    assert_eq!((status, mime.as_str(), body), (200, "audio/wav", wav));
    let m = v.err("raw", &[("path", "page")], 400);
    assert!(m.contains("not an image or audio"), "{m}");
}

/// A `py.dataframe` node as python/treepack/integrations/pandas.py writes one.
fn frame_node() -> Node {
    let s = |x: &str| Node::from(x);
    let arr = |d: DType, vals: Vec<u8>| {
        Node::from(ArrayData::new(d.clone(), vec![vals.len() as u64 / d.itemsize()], vals).unwrap())
    };
    let i64s = |v: &[i64]| arr(DType::I64, v.iter().flat_map(|x| x.to_le_bytes()).collect());
    let bools = |v: &[bool]| arr(DType::Bool, v.iter().map(|&b| u8::from(b)).collect());
    let strings = |text: &str, ends: &[i64], mask: &[bool]| {
        Node::dict([
            ("kind", s("string")),
            ("storage", s("python")),
            ("na", s("nan")),
            ("mask", bools(mask)),
            ("text", s(text)),
            ("ends", i64s(ends)),
        ])
    };
    let index = |values: Node, name: Node| Node::dict([("kind", s("index")), ("values", values), ("name", name)]);
    let n = 120i64;
    let ints: Vec<i64> = (0..n).map(|i| i * 10).collect();
    let names: Vec<String> = (0..n).map(|i| format!("é{i}")).collect();
    let mut ends = vec![];
    let mut total = 0;
    for x in &names {
        total += x.chars().count() as i64;
        ends.push(total);
    }
    let datetime = Tree::Custom {
        type_name: "py.datetime64".into(),
        data: serde_json::json!({"count": 1, "kind": "M", "unit": "s"}),
        children: vec![("values".into(), i64s(&(0..n).map(|i| 86_400 * i + 3600).collect::<Vec<_>>()))],
    };
    let columns = index(strings("countnametimecolour", &[5, 9, 13, 19], &[false; 4]), Node::none());
    let values = Node::list([
        Node::dict([("kind", s("numpy")), ("values", i64s(&ints))]),
        strings(&names.concat(), &ends, &(0..n).map(|i| i == 2).collect::<Vec<_>>()),
        Node::dict([("kind", s("numpy")), ("values", datetime)]),
        Node::dict([
            ("kind", s("category")),
            ("codes", arr(DType::I8, (0..n).map(|i| if i == 3 { 0xff } else { (i % 2) as u8 }).collect())),
            ("categories", index(strings("redblue", &[3, 7], &[false, false]), Node::none())),
            ("ordered", Node::from(false)),
        ]),
    ]);
    let range = Node::dict([
        ("kind", s("range")),
        ("start", Node::from(100i64)),
        ("stop", Node::from(100 + 2 * n)),
        ("step", Node::from(2i64)),
        ("name", s("row")),
    ]);
    Tree::Custom {
        type_name: "py.dataframe".into(),
        data: serde_json::Value::Null,
        children: vec![("columns".into(), columns), ("index".into(), range), ("values".into(), values)],
    }
}

#[test]
fn dataframes_show_as_tables_of_their_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("df");
    treepack::save(&Node::dict([("df", frame_node())]), dir.to_str().unwrap(), &SaveOptions::default()).unwrap();
    let v = view(&[dir.to_str().unwrap()]);
    assert_eq!(v.ok("node", &[("path", "df")])["views"], serde_json::json!(["frame"]));
    let f = v.ok("frame", &[("path", "df"), ("offset", "1"), ("limit", "3")]);
    assert_eq!((f["rows"].as_u64(), f["offset"].as_u64(), f["count"].as_u64()), (Some(120), Some(1), Some(3)));
    assert_eq!(f["index"]["name"], "row");
    assert_eq!(f["index"]["values"], serde_json::json!([102, 104, 106]));
    let cols = f["columns"].as_array().unwrap();
    let labels: Vec<&str> = cols.iter().map(|c| c["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["count", "name", "time", "colour"]);
    let dtypes: Vec<&str> = cols.iter().map(|c| c["dtype"].as_str().unwrap()).collect();
    assert_eq!(dtypes, ["int64", "str", "datetime64[s]", "category"]);
    assert_eq!(cols[0]["values"], serde_json::json!([10, 20, 30]));
    // Strings cut at code points, a masked one missing.
    assert_eq!(cols[1]["values"], serde_json::json!(["é1", null, "é3"]));
    assert_eq!(
        cols[2]["values"],
        serde_json::json!(["1970-01-02 01:00:00", "1970-01-03 01:00:00", "1970-01-04 01:00:00"])
    );
    // Category codes as their labels; −1 missing.
    assert_eq!(cols[3]["values"], serde_json::json!(["blue", "red", null]));
    // The last page is clipped; past the end there is nothing.
    let last = v.ok("frame", &[("path", "df"), ("offset", "115"), ("limit", "50")]);
    assert_eq!(last["count"], 5);
    assert_eq!(last["columns"][1]["values"][4], "é119");
    assert_eq!(v.ok("frame", &[("path", "df"), ("offset", "500")])["count"], 0);
    // Columns paged too.
    let c = v.ok("frame", &[("path", "df"), ("col_offset", "2"), ("col_limit", "1"), ("limit", "1")]);
    assert_eq!((c["columns_total"].as_u64(), c["columns"][0]["label"].as_str()), (Some(4), Some("time")));
    let m = v.err("frame", &[("path", "df/values")], 400);
    assert!(m.contains("not a pandas DataFrame"), "{m}");
}

#[test]
fn a_heatmap_slice_reads_only_the_chunks_it_touches() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("big");
    // 2048 × 2048 float32 (16 MiB) in 64 chunks of 256 × 256 (256 KiB each).
    let opts = SaveOptions { chunk_shapes: vec![("big".into(), vec![256, 256])], ..SaveOptions::default() };
    let tree = Node::dict([("big", f32_array(vec![2048, 2048], |i| (i % 2048) as f32))]);
    treepack::save(&tree, dir.to_str().unwrap(), &opts).unwrap();
    let v = view(&[dir.to_str().unwrap()]);
    let node = v.ok("node", &[("path", "big")]);
    assert_eq!(node["storage"]["chunks"], 64);
    let chunk = node["storage"]["stored_bytes"].as_u64().unwrap() / 64;
    let read = || v.ok("io", &[])["bytes_read"].as_u64().unwrap();
    // A heatmap of one chunk's region; of a region across two chunks (one row of the grid, two
    // columns); of one across four. The reader may read less than a whole raw chunk (only the
    // rows it needs), never more than the chunks touched: the whole array is 64.
    for (slice, chunks) in [("0:256, 0:256", 1), ("300:400, 500:700", 2), ("1000:1100, 250:260", 4)] {
        let before = read();
        let s = v.ok("slice", &[("path", "big"), ("slice", slice), ("max", "512")]);
        assert_eq!(s["kind"], "heatmap");
        let got = read() - before;
        assert!(
            got > 0 && got <= chunks * chunk,
            "{slice}: read {got} bytes, more than the {chunks} chunks it touches"
        );
    }
}
