//! Batches whose operations and results stay in device buffers.

use crate::error::{Error, Result};

/// A batch whose operations and results live in device buffers of the index's GPU, for
/// GPU-resident callers: keys and results never leave the device. Buffers need
/// `STORAGE` usage; words are little-endian u32, laid out as the host API encodes them.
#[derive(Clone, Copy, Debug)]
pub struct DeviceBatch<'a> {
    /// Operations in the batch.
    pub len: u32,
    /// One [`crate::OpKind`] code per operation.
    pub kinds: &'a wgpu::Buffer,
    /// `key_bytes / 4` words per operation.
    pub keys: &'a wgpu::Buffer,
    /// `ceil(value_bytes / 4)` words per operation (read for insert, upsert, update); the
    /// index computes each value's checksum itself.
    pub values: &'a wgpu::Buffer,
    /// Output: one [`crate::Status`] code per operation.
    pub statuses: &'a wgpu::Buffer,
    /// Output: `ceil(value_bytes / 4)` words per operation, the values gets found (zeros for a
    /// verified read whose status is [`crate::Status::Corrupt`]; untouched for other statuses).
    pub found: &'a wgpu::Buffer,
    /// The caller's word that every operation is a get: the batch then runs as one kernel
    /// (no allocation stage, no second phase, nothing persisted). An operation that is not a
    /// get is not run, and the call returns [`crate::Error::NotReadsOnly`] (its gets did run).
    pub reads_only: bool,
}

impl<'a> DeviceBatch<'a> {
    /// Refuses buffers too small for `len` operations of `key_words`-word keys and
    /// `value_words`-word values, or without `STORAGE` usage.
    pub fn validate(&self, key_words: u32, value_words: u32) -> Result<()> {
        let n = self.len as u64;
        let (kw, vw) = (key_words as u64, value_words as u64);
        for (name, buf, words) in [
            ("kinds", self.kinds, n),
            ("keys", self.keys, n * kw),
            ("values", self.values, n * vw),
            ("statuses", self.statuses, n),
            ("found", self.found, n * vw),
        ] {
            if buf.size() < words.max(1) * 4 {
                return Err(Error::InvalidConfig(format!(
                    "device batch of {n} operations: buffer {name} has {} bytes, needs {}",
                    buf.size(),
                    words.max(1) * 4
                )));
            }
            if !buf.usage().contains(wgpu::BufferUsages::STORAGE) {
                return Err(Error::InvalidConfig(format!("device batch: buffer {name} lacks STORAGE usage")));
            }
        }
        Ok(())
    }

    /// The batch's buffers: kinds, keys, values, statuses, found.
    pub(crate) fn buffers(&self) -> [&'a wgpu::Buffer; 5] {
        [self.kinds, self.keys, self.values, self.statuses, self.found]
    }

    /// The batch's buffers as the kernels bind them (`kinds`, `keys`, `values`, `statuses`,
    /// `found`), each only as far as `len` operations reach: a larger buffer may exceed the
    /// device's binding limit.
    pub fn bindings(&self, key_words: u32, value_words: u32) -> [wgpu::BindingResource<'a>; 5] {
        let n = self.len as u64;
        let range = |buffer: &'a wgpu::Buffer, words_per_op: u64| {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer,
                offset: 0,
                size: wgpu::BufferSize::new((n * words_per_op).max(1) * 4),
            })
        };
        let (kw, vw) = (key_words as u64, value_words as u64);
        [
            range(self.kinds, 1),
            range(self.keys, kw),
            range(self.values, vw),
            range(self.statuses, 1),
            range(self.found, vw),
        ]
    }
}
