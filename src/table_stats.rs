//! What a table holds and how it is shaped: the part of the stats that needs no engine, shared
//! by [`crate::GpHash::stats`] and [`crate::inspect`].

use std::fmt;

use crate::layout::{Geometry, Layout};

/// What a table holds and how it is shaped.
#[derive(Clone, Debug, PartialEq)]
pub struct TableStats {
    /// Published keys.
    pub items: u64,
    /// Slots in the table.
    pub slots: u64,
    /// `items / slots`.
    pub load_factor: f64,
    /// Layout.
    pub layout: Layout,
    /// Key width.
    pub key_bytes: u32,
    /// Value size.
    pub value_bytes: u32,
    /// Levels in use: the top level's index (it has `2^top` buckets) down to the bottom's.
    pub levels: (u32, u32),
    /// Value cells in the heap.
    pub cells: u64,
}

impl TableStats {
    /// The stats of a table of geometry `geo` holding `items` keys.
    pub fn of(geo: &Geometry, items: u64) -> TableStats {
        TableStats {
            items,
            slots: geo.slots(),
            load_factor: items as f64 / geo.slots() as f64,
            layout: geo.layout,
            key_bytes: geo.key_bytes,
            value_bytes: geo.value_bytes,
            levels: (geo.top_level, geo.top_level + 1 - geo.layout.levels),
            cells: geo.cells,
        }
    }
}

impl fmt::Display for TableStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "keys:          {} in {} slots (load factor {:.4})",
            self.items, self.slots, self.load_factor
        )?;
        writeln!(
            f,
            "layout:        {} with {}-byte keys and {}-byte values",
            self.layout, self.key_bytes, self.value_bytes
        )?;
        writeln!(
            f,
            "levels:        {} .. {} (top level has 2^{} buckets)",
            self.levels.0, self.levels.1, self.levels.0
        )?;
        write!(f, "value cells:   {}", self.cells)
    }
}
