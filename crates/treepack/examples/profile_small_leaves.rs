//! Profiling aid for the many-small-leaves workload (W2 in bench/): builds 100k leaves, then
//! times save, manifest decode (open), structure and load. `perf record` this in release.
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use treepack::*;

fn main() -> Result<()> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(25_000);
    let reps: usize = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let groups = (0..n).map(|i| {
        let m =
            ArrayData::new(DType::F32, vec![4], (0..4).flat_map(|_| (i as f32).to_le_bytes()).collect::<Vec<u8>>())?;
        Ok((
            format!("p{i}"),
            Node::dict([
                ("step", Node::from(i as i64)),
                ("lr", Node::from(1e-3 * (i % 7) as f64)),
                ("name", Node::from(format!("param_{i}"))),
                ("m", Node::from(m)),
            ]),
        ))
    });
    let groups: Vec<(String, Node)> = groups.collect::<Result<_>>()?;
    let tree = Node::dict([("opt", Node::dict(groups))]);
    eprintln!(
        "sizes: Tree<Entry> {} Entry {} Key {} ArrayEntry {} Tree<Leaf> {}",
        std::mem::size_of::<Tree<treepack::format::manifest::Entry>>(),
        std::mem::size_of::<treepack::format::manifest::Entry>(),
        std::mem::size_of::<Key>(),
        std::mem::size_of::<treepack::format::manifest::ArrayEntry>(),
        std::mem::size_of::<Node>()
    );
    let dir = std::env::temp_dir().join("treepack-profile-small");
    let p = dir.to_str().unwrap_or("treepack-profile-small");
    if std::env::var_os("DECODE_ONLY").is_some() {
        // `DECODE_ONLY=1 perf record …`: profile manifest decoding alone.
        let bytes = match std::env::var_os("MANIFEST") {
            // `MANIFEST=path/treepack.json`: decode that manifest instead.
            Some(m) => std::fs::read(m).unwrap_or_default(),
            None => {
                save(&tree, p, &SaveOptions { overwrite: true, ..Default::default() })?;
                std::fs::read(dir.join("treepack.json")).unwrap_or_default()
            }
        };
        for _ in 0..reps {
            let t = Instant::now();
            let m = treepack::format::manifest::decode(&bytes, "m")?;
            let t_decode = t.elapsed();
            let t = Instant::now();
            drop(m);
            println!("decode {t_decode:?}, drop {:?}", t.elapsed());
        }
        return Ok(());
    }
    for _ in 0..reps {
        let t = Instant::now();
        save(&tree, p, &SaveOptions { overwrite: true, ..Default::default() })?;
        let t_save = t.elapsed();
        let bytes = std::fs::read(dir.join("treepack.json")).unwrap_or_default();
        let t = Instant::now();
        let _ = serde_json::from_slice::<serde_json::Value>(&bytes);
        let t_value = t.elapsed();
        let t = Instant::now();
        let _ = treepack::format::manifest::decode(&bytes, "m")?;
        let t_decode = t.elapsed();
        println!("manifest {} bytes: serde_json::Value {t_value:?}, decode {t_decode:?}", bytes.len());
        let t = Instant::now();
        let r = open(p)?;
        let t_open = t.elapsed();
        let t = Instant::now();
        let s = r.structure().unwrap();
        let t_struct = t.elapsed();
        let t = Instant::now();
        let back = r.load(&LoadOptions::default())?;
        let t_load = t.elapsed();
        assert_eq!(back.leaf_count(), s.leaf_count());
        println!("save {t_save:?}  open {t_open:?}  structure {t_struct:?}  load {t_load:?}");
    }
    Ok(())
}
