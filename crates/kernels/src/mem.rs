//! Large buffers backed by transparent huge pages where the OS offers them.
//!
//! The repacked weights and the KV cache are the only big anonymous buffers of the
//! forward pass, and both are read in long sweeps every step. On 4 KiB pages such a
//! sweep needs a page walk every 4 KiB; on 2 MiB pages the TLB covers it. Linux maps
//! transparent huge pages on first touch for ranges advised with `MADV_HUGEPAGE` when
//! `/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` (the common default) or
//! `always`; elsewhere the advice is refused or ignored and the buffer stays on small
//! pages, with the same contents.

/// A zeroed vector of `n` elements whose pages are advised to be huge. Like
/// `vec![T::default(); n]` the pages are mapped lazily, so unused capacity costs nothing
/// until written (in 2 MiB steps instead of 4 KiB ones).
pub fn zeroed_huge<T: Copy + Default>(n: usize) -> Vec<T> {
    let v = vec![T::default(); n];
    advise_huge(v.as_ptr() as *const u8, std::mem::size_of_val(v.as_slice()));
    v
}

/// Advises the kernel to back `[p, p + bytes)` with huge pages where it can. Only the
/// whole 2 MiB-aligned stretches inside the range can be; a hint, never an error.
pub fn advise_huge(p: *const u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    if let Some((start, len)) = huge_stretch(p as usize, bytes) {
        // SAFETY: madvise with MADV_HUGEPAGE changes how future faults in an existing
        // mapping are served; it neither moves nor invalidates memory.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, bytes);
}

const HUGE_PAGE: usize = 2 << 20;

/// The whole huge pages inside `[addr, addr + bytes)`: their start and length, if any.
fn huge_stretch(addr: usize, bytes: usize) -> Option<(usize, usize)> {
    let start = addr.checked_next_multiple_of(HUGE_PAGE)?;
    let end = addr.checked_add(bytes)? / HUGE_PAGE * HUGE_PAGE;
    (end > start).then(|| (start, end - start))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only whole, aligned huge pages are advised; a range holding none gives nothing.
    #[test]
    fn advises_only_whole_aligned_huge_pages() {
        let h = HUGE_PAGE;
        assert_eq!(huge_stretch(h, 3 * h), Some((h, 3 * h)));
        assert_eq!(huge_stretch(h + 4096, 3 * h), Some((2 * h, 2 * h)));
        assert_eq!(huge_stretch(h + 4096, h), None);
        assert_eq!(huge_stretch(4096, 2 * h), Some((h, h)));
        assert_eq!(huge_stretch(usize::MAX - 10, 100), None);
        let v = zeroed_huge::<u16>(3 * h);
        assert_eq!(v.len(), 3 * h);
        assert!(v.iter().all(|&x| x == 0));
    }
}
