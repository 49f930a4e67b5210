mod common;

use gphash::{Config, GpHash, GpuOptions, Status};

#[test]
fn insert_then_get_on_the_gpu() {
    let dir = common::pool_dir();
    let cfg = Config {
        capacity: 5000,
        ..Default::default()
    };
    let mut t = GpHash::create(
        Some(&dir.path().join("p")),
        &cfg,
        &common::gpu_options(GpuOptions::default()),
    )
    .unwrap();
    eprintln!("{}", t.stats());
    let keys: Vec<u8> = (0..3000u64).flat_map(|k| k.to_le_bytes()).collect();
    let vals: Vec<u8> = (0..3000u64).flat_map(|k| (k * 7).to_le_bytes()).collect();
    let st = t.insert(&keys, &vals).unwrap();
    assert!(st.iter().all(|s| *s == Status::Ok), "{:?}", &st[..10]);
    let r = t.get(&keys).unwrap();
    for i in 0..3000 {
        assert_eq!(r.value(i), Some(&vals[i * 8..i * 8 + 8]), "key {i}");
    }
    assert_eq!(t.len(), 3000);
    assert!(t.check().ok(), "{}", t.check());
    eprintln!("{}", t.stats());
}
