//! Mixed batches: many operations of different kinds in one submission, and their results
//! read per operation, executed unordered (fastest) or in batch order.
//!
//! `cargo run --release --example batches`

use gphash::{Status, TypedIndex};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?;
    let map = TypedIndex::<u64, u64>::create(dir.path().join("batches.pool"), 10_000)?;
    let start = [(1, 10), (2, 20)];
    map.upsert_many(&start)?;

    // Result `i` is that of the `i`-th operation pushed; calls chain.
    let mut batch = map.batch();
    batch.get(&1).upsert(&1, &11).get(&1).remove(&2).get(&2).insert(&5, &50).update(&9, &90);
    let ops = ["get 1", "upsert 1 = 11", "get 1", "remove 2", "get 2", "insert 5 = 50", "update 9 = 90"];

    // Unordered: operations on different keys are independent, operations on one key take
    // effect in some order, and every get reads the table as it was before the batch.
    let unordered = map.execute(&batch)?;
    print_results("execute (unordered)", &ops, &unordered.iter().collect::<Vec<_>>());
    assert_eq!(unordered.value(0), Some(10));
    assert_eq!(unordered.value(2), Some(10), "reads see the table before the batch");
    assert_eq!(unordered.value(4), Some(20));
    assert_eq!(map.get_many(&[1, 2, 5])?, [Some(11), None, Some(50)]);

    // Back to the starting state, then the same batch in order: the results of applying the
    // operations one by one (repeated keys run in successive rounds).
    map.upsert_many(&start)?;
    map.remove(&5)?;
    let ordered = map.execute_ordered(&batch)?;
    print_results("execute_ordered", &ops, &ordered.iter().collect::<Vec<_>>());
    assert_eq!(ordered.value(2), Some(11), "the get after the upsert sees it");
    assert_eq!(ordered.statuses()[4], Status::NotFound, "the get after the remove misses");
    assert_eq!(ordered.statuses()[6], Status::NotFound, "key 9 is absent: nothing to update");

    map.close()?;
    Ok(())
}

fn print_results(title: &str, ops: &[&str], results: &[(Status, Option<u64>)]) {
    println!("{title}:");
    for (op, (status, value)) in ops.iter().zip(results) {
        match value {
            Some(v) => println!("  {op:<14} -> {status:?}, value {v}"),
            None => println!("  {op:<14} -> {status:?}"),
        }
    }
}
