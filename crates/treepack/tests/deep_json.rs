//! JSON nested 100,000 deep wherever a file holds free JSON (issue 50, finding 3): a manifest's
//! `metadata`, a custom node's `data`, an array's `as` and `preview`, a structured dtype, a
//! tagged scalar's `v`, a transport document's manifest, a part manifest, a repository's small
//! files; and a safetensors tensor name that splits into 20,000 nested keys. Each used to
//! overflow the stack (an abort no caller can catch). Each case runs in a child process
//! (tests/support/child.rs): a crash fails the test instead of the suite, and every reader of
//! the file must end with a typed error naming the file and the member.

#[path = "support/child.rs"]
mod child;

use child::Outside;
use std::path::Path;
use treepack::format::manifest::{self, outline::outline, seal, OwnedTree};
use treepack::*;

/// How deep the hostile values nest.
const DEEP: usize = 100_000;
const FILE: &str = "treepack.json";

fn nested_lists(depth: usize) -> String {
    "[".repeat(depth) + &"]".repeat(depth)
}

fn nested_objects(depth: usize) -> String {
    "{\"a\":".repeat(depth) + "1" + &"}".repeat(depth)
}

/// A manifest in the writer's layout (so the streamed parse applies), sealed so that its
/// checksum holds and the parse is what refuses it.
fn manifest_bytes(metadata: Option<&str>, root: &str) -> Vec<u8> {
    let metadata = metadata.map(|m| format!("\n\"metadata\":{m},")).unwrap_or_default();
    seal(
        format!("{{\"format\":\"treepack\",\"version\":[1,4],\n\"writer\":\"deep\",{metadata}\n\"packs\":[],\n\"root\":{root}")
            .as_bytes(),
    )
}

fn write_tree(loc: &Path, manifest: &[u8]) {
    std::fs::create_dir_all(loc).unwrap();
    std::fs::write(loc.join(FILE), manifest).unwrap();
}

/// One reader's result as `name: ok` or `name: error <kind>: <message>`.
fn line<T>(name: &str, r: Result<T>) -> String {
    format!("{name}: {}", child::outcome(r).trim_start_matches("outcome "))
}

/// In the child: every reader of the tree at `dir`, each result on the one `outcome` line the
/// parent reads (separated by ` || `).
fn read_every_way(dir: &Path) {
    let p = dir.to_str().unwrap();
    let bytes = std::fs::read(dir.join(FILE)).unwrap();
    let mut out = vec![
        line("load", load(p, &LoadOptions::default())),
        line("load_structure", load_structure(p)),
        line(
            "open",
            open(p).and_then(|r| {
                r.structure()?;
                r.verify()
            }),
        ),
        line("decode", manifest::decode(&bytes, FILE)),
        line("build", manifest::build(&bytes, FILE, &OwnedTree)),
        line("outline", outline(&bytes, FILE, &mut |_| true)),
    ];
    // `None` where it does not apply (a `metadata` the head's parse refuses, no helper thread).
    if let Some(r) = manifest::build_streamed_any_size(&bytes, FILE, &OwnedTree) {
        out.push(line("streamed", r));
    }
    println!("outcome {}", out.join(" || "));
}

/// Every reader's result must be an error of `kind` whose message holds each of `needles`.
fn assert_all_refuse(got: &str, kind: &str, needles: &[&str]) {
    eprintln!("{got}");
    for r in got.trim_start_matches("outcome ").split(" || ") {
        assert!(r.contains(&format!(": error {kind}: ")), "expected a {kind} error: {r}");
        for n in needles {
            assert!(r.contains(n), "{n:?} not in: {r}");
        }
    }
}

/// A manifest case. In the child process the test runs itself in: every reader run on the tree
/// there. In the parent: the manifest written, the child run, every reader's refusal checked.
fn manifest_case(test: &str, manifest: Vec<u8>, needles: &[&str]) {
    if let Some(dir) = child::case() {
        return read_every_way(&dir);
    }
    let out = Outside::new();
    write_tree(&out.loc, &manifest);
    let got = child::run(test, &out.loc);
    assert_all_refuse(&got, "invalid_manifest", &[&[FILE][..], needles].concat());
    out.assert_unchanged();
}

const TOO_DEEP: &str = "JSON nested deeper than 128 levels";

#[test]
fn deep_metadata() {
    manifest_case("deep_metadata", manifest_bytes(Some(&nested_lists(DEEP)), "1"), &["member `metadata`", TOO_DEEP]);
}

#[test]
fn deep_metadata_objects() {
    let m = manifest_bytes(Some(&nested_objects(DEEP)), "1");
    manifest_case("deep_metadata_objects", m, &["member `metadata`", TOO_DEEP]);
}

#[test]
fn deep_custom_data() {
    let root = format!("{{\"m\":{{\"t\":\"custom\",\"type\":\"x.Y\",\"data\":{}}}}}", nested_lists(DEEP));
    manifest_case("deep_custom_data", manifest_bytes(None, &root), &["at `m`", "member `data`", TOO_DEEP]);
}

fn int8_array(extra: &str) -> String {
    format!("{{\"model\":{{\"w\":{{\"t\":\"array\",\"dtype\":\"int8\",\"shape\":[1],{extra}\"data\":\"AQ==\"}}}}}}")
}

#[test]
fn deep_array_annotation() {
    let root = int8_array(&format!("\"as\":{{\"type\":\"torch.Tensor\",\"x\":{}}},", nested_lists(DEEP)));
    manifest_case("deep_array_annotation", manifest_bytes(None, &root), &["at `model/w`", "member `as`", TOO_DEEP]);
}

#[test]
fn deep_preview() {
    let root = int8_array(&format!("\"preview\":{{\"head\":{}}},", nested_lists(DEEP)));
    manifest_case("deep_preview", manifest_bytes(None, &root), &["at `model/w`", "member `preview`", TOO_DEEP]);
}

#[test]
fn deep_structured_dtype() {
    // A dtype object nested as deep as it goes: refused at the dtype's own bound while it is
    // read, not after (its 16 struct levels are counted once it is whole).
    let root = format!(
        "{{\"model\":{{\"w\":{{\"t\":\"array\",\"dtype\":{{\"struct\":[{{\"name\":\"a\",\"dtype\":{}}}]}},\"shape\":[0],\"data\":\"\"}}}}}}",
        nested_objects(DEEP)
    );
    let limit = format!("JSON nested deeper than {} levels", treepack::format::json::MAX_DTYPE_JSON_DEPTH);
    manifest_case("deep_structured_dtype", manifest_bytes(None, &root), &["at `model/w`", "member `dtype`", &limit]);
}

#[test]
fn deep_tagged_scalars() {
    if let Some(dir) = child::case() {
        return read_every_way(&dir);
    }
    for t in ["int", "float", "complex"] {
        let root = format!("{{\"s\":{{\"t\":\"{t}\",\"v\":{}}}}}", nested_lists(DEEP));
        // One tree per tag, each read in its own child.
        manifest_case("deep_tagged_scalars", manifest_bytes(None, &root), &["at `s`", "member `v`", TOO_DEEP]);
    }
}

/// A manifest over 1 MiB whose root is a list of 300 items: its items are parsed apart, on
/// several threads (format/manifest/strategy.rs: `SPLIT_MIN_BYTES`, `SPLIT_MIN_ITEMS`), and the
/// structure is read by the outline (`OUTLINE_MIN_BYTES`).
#[test]
fn deep_value_in_a_big_manifest() {
    let mut items: Vec<String> = (0..300).map(|i| format!("\"{}\"", format!("{i:04}").repeat(900))).collect();
    items.push(format!("{{\"t\":\"custom\",\"type\":\"x.Y\",\"data\":{}}}", nested_lists(DEEP)));
    let m = manifest_bytes(None, &format!("[{}]", items.join(",")));
    assert!(m.len() > (1 << 20) + nested_lists(DEEP).len(), "{} bytes", m.len());
    manifest_case("deep_value_in_a_big_manifest", m, &["at `300`", "member `data`", TOO_DEEP]);
}

/// A value at the limit under a tree nearly as deep as trees go: read by every reader, its
/// levels and the tree's on one thread's stack.
#[test]
fn value_at_the_limit_under_a_deep_tree_reads() {
    if let Some(dir) = child::case() {
        return read_every_way(&dir);
    }
    let levels = treepack::format::manifest::MAX_DEPTH - 2;
    let data = nested_lists(treepack::format::json::MAX_VALUE_DEPTH);
    let root = "{\"a\":".repeat(levels)
        + &format!("{{\"t\":\"custom\",\"type\":\"x.Y\",\"data\":{data}}}")
        + &"}".repeat(levels);
    let out = Outside::new();
    write_tree(&out.loc, &manifest_bytes(Some(&data), &root));
    let got = child::run("value_at_the_limit_under_a_deep_tree_reads", &out.loc);
    for r in got.trim_start_matches("outcome ").split(" || ") {
        assert!(r.ends_with(": ok"), "{got}");
    }
    out.assert_unchanged();
}

/// The limits are the format's, not a guess: a value exactly at them reads back, and a save
/// refuses one past them (a writer never writes what readers refuse).
#[test]
fn values_at_the_limit_round_trip_and_past_it_are_not_saved() {
    use serde_json::Value;
    let nest = |depth: usize| (0..depth).fold(Value::from(1), |v, _| Value::Array(vec![v]));
    let d = tempfile::tempdir().unwrap();
    let ok = d.path().join("ok");
    let limit = treepack::format::json::MAX_VALUE_DEPTH;
    let a = ArrayData::new(DType::I8, vec![1], vec![1u8])
        .unwrap()
        .with_annotation(Some(serde_json::json!({"type": "t", "x": nest(limit - 1)})))
        .unwrap();
    let tree = Node::dict([
        ("c", Tree::Custom { type_name: "x.Y".into(), data: nest(limit), children: vec![] }),
        ("w", Node::from(a)),
    ]);
    let opts = SaveOptions { metadata: Some(nest(limit)), ..Default::default() };
    save(&tree, ok.to_str().unwrap(), &opts).unwrap();
    assert!(load(ok.to_str().unwrap(), &LoadOptions::default()).unwrap().exact_eq(&tree));
    let r = open(ok.to_str().unwrap()).unwrap();
    assert_eq!(r.manifest().metadata, Some(nest(limit)));
    load_structure(ok.to_str().unwrap()).unwrap();

    let refused = |tree: &Node, opts: &SaveOptions, needle: &str| {
        let e = save(tree, d.path().join("no").to_str().unwrap(), opts).unwrap_err();
        assert_eq!(e.kind(), "limit_exceeded", "{e}");
        assert!(e.to_string().contains(needle), "{e}");
        assert!(!d.path().join("no").join(FILE).exists());
    };
    let deep_meta = SaveOptions { metadata: Some(nest(limit + 1)), ..Default::default() };
    refused(&Node::from(1i64), &deep_meta, "`metadata`");
    let custom = Node::dict([("c", Tree::Custom { type_name: "x.Y".into(), data: nest(limit + 1), children: vec![] })]);
    refused(&custom, &SaveOptions::default(), "the `data` of `c`");
    let a = ArrayData::new(DType::I8, vec![1], vec![1u8])
        .unwrap()
        .with_annotation(Some(serde_json::json!({"type": "t", "x": nest(limit)})))
        .unwrap();
    refused(&Node::dict([("w", Node::from(a))]), &SaveOptions::default(), "the `as` of `w`");
}

// ------------------------------------------------------------------ transport documents

fn transport_doc(metadata: &str) -> Vec<u8> {
    use treepack::format::transport as form;
    form::write(&manifest_bytes(Some(metadata), "{\"a\":1}"), b"", form::Encoding::Base85).into_bytes()
}

#[test]
fn deep_metadata_in_a_transport_document() {
    if let Some(dir) = child::case() {
        let doc_path = dir.join("doc.json");
        let p = doc_path.to_str().unwrap();
        let doc = std::fs::read(&doc_path).unwrap();
        let out = [
            line("load", load(p, &LoadOptions::default())),
            line("load_structure", load_structure(p)),
            line("open", open(p).map(drop)),
            line("transport::open", transport::open(&doc).map(drop)),
            line("import", transport::import(&doc, dir.join("imported").to_str().unwrap(), &SaveOptions::default())),
        ];
        println!("outcome {}", out.join(" || "));
        return;
    }
    let out = Outside::new();
    std::fs::create_dir_all(&out.loc).unwrap();
    std::fs::write(out.loc.join("doc.json"), transport_doc(&nested_lists(DEEP))).unwrap();
    let got = child::run("deep_metadata_in_a_transport_document", &out.loc);
    assert_all_refuse(&got, "invalid_manifest", &["member `metadata`", TOO_DEEP]);
    assert!(!out.loc.join("imported").exists());
    out.assert_unchanged();
}

// ------------------------------------------------------------------ saves written in parts

#[test]
fn deep_data_in_a_part_manifest() {
    if let Some(dir) = child::case() {
        let parts = vec![std::fs::read(dir.join("part0")).unwrap(), std::fs::read(dir.join("part1")).unwrap()];
        let r = commit_parts(dir.join("tree").to_str().unwrap(), &parts, &SaveOptions::default());
        println!("outcome {}", line("commit_parts", r));
        return;
    }
    let out = Outside::new();
    std::fs::create_dir_all(&out.loc).unwrap();
    let (good, _) = save_part(
        &Node::dict([("x", Node::from(1i64))]),
        out.loc.join("tree").to_str().unwrap(),
        &SaveOptions::default(),
    )
    .unwrap();
    let root = format!("{{\"x\":{{\"t\":\"custom\",\"type\":\"treepack.shards\",\"data\":{}}}}}", nested_lists(DEEP));
    std::fs::write(out.loc.join("part0"), good).unwrap();
    std::fs::write(out.loc.join("part1"), manifest_bytes(None, &root)).unwrap();
    let got = child::run("deep_data_in_a_part_manifest", &out.loc);
    assert_all_refuse(&got, "invalid_manifest", &["part 1", "at `x`", "member `data`", TOO_DEEP]);
    assert!(!out.loc.join("tree").join(FILE).exists());
    out.assert_unchanged();
}

// ------------------------------------------------------------------ safetensors names

/// A safetensors file of one 1-byte tensor named `name`.
fn safetensors_file(name: &str) -> Vec<u8> {
    let header = serde_json::json!({name: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}).to_string();
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.push(7);
    b
}

fn convert_to_treepack(src: &Path, dst: &Path) -> Result<convert::ConvertInfo> {
    let (s, d) = (Location::parse(src.to_str().unwrap())?, Location::parse(dst.to_str().unwrap())?);
    // Names split at ".": the nesting a hostile name's dots would make.
    let opts = convert::ConvertOptions { separator: Some(".".into()), ..Default::default() };
    convert::convert(&s, &d, convert::Format::Safetensors, convert::Format::Treepack, &opts)
}

#[test]
fn safetensors_name_with_20000_dots() {
    if let Some(dir) = child::case() {
        let src = dir.join("m.safetensors");
        let loc = Location::parse(src.to_str().unwrap()).unwrap();
        let out = [
            line("read_safetensors", convert::read_safetensors(&loc, Some("."))),
            line("convert", convert_to_treepack(&src, &dir.join("t"))),
        ];
        println!("outcome {}", out.join(" || "));
        return;
    }
    let out = Outside::new();
    std::fs::create_dir_all(&out.loc).unwrap();
    let name = "a.".repeat(20_000) + "w";
    let file = safetensors_file(&name);
    assert!(file.len() < 41_000, "{}", file.len());
    std::fs::write(out.loc.join("m.safetensors"), file).unwrap();
    let got = child::run("safetensors_name_with_20000_dots", &out.loc);
    assert_all_refuse(
        &got,
        "limit_exceeded",
        &["m.safetensors", "tensor \"a.a.a.a.", "(40001 bytes)", "more than 999 nested keys at \".\"", "no separator"],
    );
    assert!(!out.loc.join("t").exists());
    out.assert_unchanged();
}

/// A name that splits into as many keys as a tree may nest converts and reads back; one more
/// is refused.
#[test]
fn safetensors_names_at_the_depth_limit() {
    if let Some(dir) = child::case() {
        let r = convert_to_treepack(&dir.join("m.safetensors"), &dir.join("t"))
            .and_then(|_| load(dir.join("t").to_str().unwrap(), &LoadOptions::default()));
        let depth = r.map(|t| {
            let (mut t, mut depth) = (&t, 0);
            while let Tree::Dict(pairs) = t {
                t = &pairs[0].1;
                depth += 1;
            }
            format!("ok, {depth} dicts deep")
        });
        let over = convert_to_treepack(&dir.join("over.safetensors"), &dir.join("u"));
        let limit = match depth {
            Ok(d) => format!("limit: {d}"),
            Err(e) => line("limit", Err::<(), _>(e)),
        };
        println!("outcome {limit} || {}", line("over", over));
        return;
    }
    let out = Outside::new();
    std::fs::create_dir_all(&out.loc).unwrap();
    let max = treepack::convert::MAX_NAME_KEYS;
    std::fs::write(out.loc.join("m.safetensors"), safetensors_file(&vec!["k"; max].join("."))).unwrap();
    std::fs::write(out.loc.join("over.safetensors"), safetensors_file(&vec!["k"; max + 1].join("."))).unwrap();
    let got = child::run("safetensors_names_at_the_depth_limit", &out.loc);
    assert!(got.starts_with(&format!("outcome limit: ok, {max} dicts deep || over: error limit_exceeded: ")), "{got}");
    assert!(got.contains(&format!("splits into more than {max} nested keys")), "{got}");
    out.assert_unchanged();
}

// ------------------------------------------------------------------ repositories

/// A repository at `loc` holding the tree `t` (one array in a pack, so there is an index).
fn repository(loc: &Path) {
    let repo = Repository::create(loc.to_str().unwrap()).unwrap();
    let a = ArrayData::new(DType::U8, vec![4096], vec![3u8; 4096]).unwrap();
    repo.save(&Node::dict([("a", Node::from(a))]), "t", &SaveOptions::default()).unwrap();
}

/// In the child: the deep file `rel` read by its own parser (`kind`: `ref`, `index`, `gc`,
/// `lease`), then the repository used as a program would: the tree `t` loaded, the names
/// listed, another tree saved (which reads the gc state and every pack index).
fn use_repository(dir: &Path) {
    use treepack::format::repo::{GcState, Lease, PackIndex, RefRecord};
    let p = dir.to_str().unwrap();
    let (kind, rel) = std::fs::read_to_string(dir.join("deep-file"))
        .unwrap()
        .split_once(' ')
        .map(|(k, r)| (k.to_string(), r.to_string()))
        .unwrap();
    let bytes = std::fs::read(dir.join(&rel)).unwrap();
    let parsed = match kind.as_str() {
        "ref" => RefRecord::decode(&bytes).map(drop),
        "index" => PackIndex::decode(&bytes).map(drop),
        "gc" => GcState::decode(&bytes).map(drop),
        _ => Lease::decode(&bytes).map(drop),
    };
    let parsed = parsed.map_err(|reason| Error::InvalidManifest { file: rel.clone(), key: String::new(), reason });
    let a = ArrayData::new(DType::U8, vec![4096], vec![3u8; 4096]).unwrap();
    let tree = Node::dict([("b", Node::from(a))]);
    let out = [
        line("decode", parsed),
        line("load", load(format!("{p}@t").as_str(), &LoadOptions::default())),
        line("names", Repository::open(p).and_then(|r| r.names())),
        line("save", Repository::open(p).and_then(|r| r.save(&tree, "u", &SaveOptions::default()))),
    ];
    println!("outcome {}", out.join(" || "));
}

/// A repository whose small file `rel` (parsed as `kind`) is JSON nested 100,000 deep, under
/// the 1 MiB such a file may have (so the parse, not the size check, meets it): its parser
/// refuses it, and the repository's readers and writers refuse it or do without it (a save
/// reuses no chunk of an index it cannot read), never crash.
fn repository_case(test: &str, kind: &str, rel: &str, load_refuses: bool) {
    let out = Outside::new();
    repository(&out.loc);
    let rel = if rel == "index" {
        let idx = std::fs::read_dir(out.loc.join("index")).unwrap().next().unwrap().unwrap();
        format!("index/{}", idx.file_name().to_str().unwrap())
    } else {
        rel.to_string()
    };
    std::fs::create_dir_all(out.loc.join(&rel).parent().unwrap()).unwrap();
    std::fs::write(out.loc.join(&rel), format!("{{\"tree\":{}}}", nested_lists(DEEP))).unwrap();
    std::fs::write(out.loc.join("deep-file"), format!("{kind} {rel}")).unwrap();
    let got = child::run(test, &out.loc);
    let result = |name: &str| {
        got.trim_start_matches("outcome ").split(" || ").find(|r| r.starts_with(name)).unwrap_or(&got).to_string()
    };
    assert!(result("decode").contains(": error invalid_manifest: "), "{got}");
    if load_refuses {
        assert!(result("load").contains(": error ") && result("load").contains(&rel), "{got}");
    }
    out.assert_unchanged();
}

/// Each small file of a repository nested too deep, in turn: a ref, a pack index, the gc
/// state, a lease (whether a load of the tree refuses it too).
#[test]
fn deep_repository_files() {
    if let Some(dir) = child::case() {
        return use_repository(&dir);
    }
    let files = [
        ("ref", "refs/t.json", true),
        ("index", "index", false),
        ("gc", "gc.json", false),
        ("lease", "leases/x.json", false),
    ];
    for (kind, rel, load_refuses) in files {
        repository_case("deep_repository_files", kind, rel, load_refuses);
    }
}
