//! Bulk copies of a batch's keys, values and results on all host threads. A batch of 2^20
//! 128-byte values moves 128 MB through each copy; one thread copies it slowly, and more slowly
//! into fresh pages, which it faults in one at a time (`docs/lab/host-path.md`, "Host copies of
//! large batches").

use rayon::prelude::*;

/// Bytes below which a copy stays on the calling thread: a task must outweigh its hand-over.
const PARALLEL_BYTES: usize = 1 << 20;

/// Bytes each task copies: whole pages, so that each task faults in pages of its own.
const TASK_BYTES: usize = 1 << 18;

/// `dst.copy_from_slice(src)`, on all host threads when it is large.
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "a bulk copy needs equal lengths");
    if src.len() < PARALLEL_BYTES {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(TASK_BYTES).zip(src.par_chunks(TASK_BYTES)).for_each(|(d, s)| d.copy_from_slice(s));
}

/// `len` copies of `value`, written on all host threads when they are large: a fresh
/// allocation's pages are faulted in (or, reused, cleared) by whoever writes them first.
pub(crate) fn filled<T: Copy + Send + Sync>(value: T, len: usize) -> Vec<T> {
    if len * size_of::<T>() < PARALLEL_BYTES {
        return vec![value; len];
    }
    let mut v = Vec::with_capacity(len);
    let per_task = (TASK_BYTES / size_of::<T>().max(1)).max(1);
    v.spare_capacity_mut()[..len]
        .par_chunks_mut(per_task)
        .for_each(|c| c.fill(std::mem::MaybeUninit::new(value)));
    // SAFETY: the first `len` elements were all written above.
    unsafe { v.set_len(len) };
    v
}

/// A queue write of `src` at the start of `buffer`, copied into wgpu's staging memory on all
/// host threads when it is large (nothing for an empty `src`; a write that wgpu refuses is
/// reported by the caller's error scope).
pub(crate) fn write_buffer(queue: &wgpu::Queue, buffer: &wgpu::Buffer, src: &[u8]) {
    if let Some(size) = wgpu::BufferSize::new(src.len() as u64)
        && let Some(mut staging) = queue.write_buffer_with(buffer, 0, size)
    {
        copy_to_staging(&mut staging, src);
    }
}

/// `src` into wgpu's staging memory for a queue write, on all host threads when it is large.
fn copy_to_staging(dst: &mut wgpu::QueueWriteBufferView, src: &[u8]) {
    let mut view = dst.slice(..);
    assert_eq!(view.len(), src.len(), "a bulk copy needs equal lengths");
    if src.len() < PARALLEL_BYTES {
        view.copy_from_slice(src);
        return;
    }
    // The view's parts are not `Send` (wgpu's `WriteOnly` of a slice): the tasks write through
    // its address.
    let base = DisjointWrites(view.as_raw_element_ptr());
    src.par_chunks(TASK_BYTES).enumerate().for_each(|(i, part)| {
        let at = base.at(i * TASK_BYTES);
        // SAFETY: the view is `src.len()` writable bytes that `view` borrows exclusively until
        // every task is done; each task writes its own `part.len()` bytes of them, only writes,
        // and `src` is other memory.
        unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), at, part.len()) };
    });
}

/// The address of memory that tasks on several threads write disjoint parts of (a staging
/// view in [`copy_to_staging`], a heap whose cells are dealt out in `resize::redeal`).
pub(crate) struct DisjointWrites(pub(crate) std::ptr::NonNull<u8>);

// SAFETY: the tasks only write through it, each to bytes no other task touches (each user says
// why its parts are disjoint).
unsafe impl Sync for DisjointWrites {}

impl DisjointWrites {
    pub(crate) fn at(&self, offset: usize) -> *mut u8 {
        self.0.as_ptr().wrapping_add(offset)
    }
}

/// Replaces `dst`'s elements with those whose bytes are `src` (a whole number of them; the
/// host is little-endian, as the device and the pool are), on all host threads when it is
/// large; `dst` keeps its allocation and no element is written twice.
pub(crate) fn refill<T: bytemuck::Pod>(dst: &mut Vec<T>, src: &[u8]) {
    let size = size_of::<T>();
    assert_eq!(src.len() % size, 0, "whole elements");
    let len = src.len() / size;
    dst.clear();
    dst.reserve(len);
    let spare = &mut dst.spare_capacity_mut()[..len];
    // SAFETY: `spare` is `len` elements of `dst`'s allocation, so its bytes are `src.len()`
    // bytes of it, and any bytes are a valid `MaybeUninit<u8>`.
    let bytes = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), src.len()) };
    if src.len() < PARALLEL_BYTES {
        copy_into(bytes, src);
    } else {
        bytes.par_chunks_mut(TASK_BYTES).zip(src.par_chunks(TASK_BYTES)).for_each(|(d, s)| copy_into(d, s));
    }
    // SAFETY: the first `len` elements were all written above (every byte of them), and any
    // bytes are a valid `T` (`Pod`).
    unsafe { dst.set_len(len) };
}

fn copy_into(dst: &mut [std::mem::MaybeUninit<u8>], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    // SAFETY: both are `src.len()` bytes, and a `&mut` cannot overlap a `&`.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), src.len()) };
}

/// Asks the CPU to bring the line at `at` into its cache (nothing elsewhere).
pub(crate) fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a hint: nothing is read, and no address faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_small_and_large_slices_whole() {
        for len in [0, 4, 1000, PARALLEL_BYTES - 4, PARALLEL_BYTES, 3 * PARALLEL_BYTES + 12] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut dst = vec![0xa5; len];
            copy(&mut dst, &src);
            assert_eq!(dst, src, "{len} bytes");
            // A vector that held more words, and one that held fewer, both end as `src`.
            for before in [len / 4 + 100, 1] {
                let mut words = vec![0xdead_beef_u32; before];
                refill(&mut words, &src);
                assert_eq!(words.len(), len / 4);
                assert_eq!(
                    bytemuck::cast_slice::<u32, u8>(&words),
                    &src[..],
                    "{len} bytes after {before} words"
                );
            }
        }
    }

    #[test]
    fn fills_small_and_large_vectors_whole() {
        for len in [0, 1, 1000, PARALLEL_BYTES / 4 - 1, PARALLEL_BYTES / 4, 3 * PARALLEL_BYTES / 4 + 5] {
            let words = filled(0x5eed_u32, len);
            assert_eq!(words.len(), len);
            assert!(words.iter().all(|&w| w == 0x5eed), "{len} words");
            let bytes = filled(7u8, 4 * len);
            assert_eq!(bytes.len(), 4 * len);
            assert!(bytes.iter().all(|&b| b == 7), "{} bytes", 4 * len);
        }
    }
}
