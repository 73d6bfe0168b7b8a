//! The GGUF byte parser: header, metadata, tensor directory, layout checks.
//!
//! Every read goes through [`Cursor`], which bounds-checks against the buffer, and every
//! count read from the file is compared with the bytes that remain (times the smallest
//! possible encoding of one item) before anything is allocated. Low-level errors are
//! plain strings describing the byte-level problem; callers prefix where it happened
//! ("key 5 (`general.name`): ...", "tensor 12 (`blk.0.attn_q.weight`): ...").

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use pagellm_kernels::quant::GgmlType;

use super::{MetaValue, TensorInfo, DEFAULT_ALIGNMENT};
use crate::error::{ModelError, Result};

const MAGIC: &[u8; 4] = b"GGUF";

/// GGML supports at most 4 dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;

/// Arrays of arrays are legal GGUF but no real model uses more than one level; the
/// limit keeps recursion bounded on hostile input.
const MAX_ARRAY_DEPTH: u32 = 3;

/// Upper bound on metadata values in one file (array elements included). Real files
/// hold a few hundred thousand (vocabulary, merges, scores); the cap bounds memory on
/// hostile input, where each 1-byte element would otherwise become a 32-byte
/// `MetaValue`.
const MAX_META_VALUES: usize = 1 << 23;

/// Largest up-front reservation for a list read from the file. A count that passed the
/// remaining-bytes check can still be large in a big file (and each item is bigger in
/// memory than on disk); beyond this the list grows only as items are actually parsed.
const MAX_PREALLOC: usize = 4096;

/// Smallest possible encodings, used to reject impossible counts before allocating.
const MIN_KV_BYTES: usize = 8 + 4 + 1; // key length, value type, 1-byte value
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 8 + 4 + 8; // name length, n_dims, 1 dim, type, offset

pub(super) struct Parsed {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: usize,
    pub data_offset: usize,
}

/// A bounds-checked little-endian reader over the whole file.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: expected {n} bytes ({what}) at offset {:#x}, but only {} remain (file size {})",
                self.pos,
                self.remaining(),
                self.buf.len()
            ));
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, String> {
        self.array(what).map(u16::from_le_bytes)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then that many bytes. The length is checked against
    /// the remaining bytes before it is used.
    fn string_bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let at = self.pos;
        let len = self.u64(what)?;
        match usize::try_from(len) {
            Ok(n) if n <= self.remaining() => self.take(n, what),
            _ => Err(format!(
                "{what} length {len} exceeds remaining {} bytes at offset {at:#x}",
                self.remaining()
            )),
        }
    }

    /// A string that must be valid UTF-8 (keys and tensor names, used for lookups).
    fn strict_string(&mut self, what: &str) -> Result<String, String> {
        let at = self.pos;
        let bytes = self.string_bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            format!(
                "{what} at offset {at:#x} is not valid UTF-8 ({e}): {:?}",
                bytes.escape_ascii().to_string()
            )
        })
    }
}

/// GGUF metadata value type ids.
mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Smallest encoded size of one value of type `ty`, or `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<usize> {
    Some(match ty {
        vt::U8 | vt::I8 | vt::BOOL => 1,
        vt::U16 | vt::I16 => 2,
        vt::U32 | vt::I32 | vt::F32 => 4,
        vt::U64 | vt::I64 | vt::F64 => 8,
        vt::STRING => 8,
        vt::ARRAY => 4 + 8,
        _ => return None,
    })
}

fn value_type_name(ty: u32) -> &'static str {
    match ty {
        vt::U8 => "u8",
        vt::I8 => "i8",
        vt::U16 => "u16",
        vt::I16 => "i16",
        vt::U32 => "u32",
        vt::I32 => "i32",
        vt::F32 => "f32",
        vt::BOOL => "bool",
        vt::STRING => "string",
        vt::ARRAY => "array",
        vt::U64 => "u64",
        vt::I64 => "i64",
        vt::F64 => "f64",
        _ => "unknown",
    }
}

/// ggml's names for tensor type ids, so "unsupported type" errors say which format the
/// file uses (ids 4, 5 and 31-33, 36-38 are retired in ggml).
fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    usize::try_from(id)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("unknown")
}

struct MetaReader<'a, 'b> {
    cur: &'b mut Cursor<'a>,
    /// Metadata values still allowed (see [`MAX_META_VALUES`]).
    budget: usize,
}

impl MetaReader<'_, '_> {
    fn value(&mut self, ty: u32, depth: u32) -> Result<MetaValue, String> {
        let c = &mut *self.cur;
        Ok(match ty {
            vt::U8 => MetaValue::U8(c.u8("u8 value")?),
            vt::I8 => MetaValue::I8(c.u8("i8 value")? as i8),
            vt::U16 => MetaValue::U16(c.u16("u16 value")?),
            vt::I16 => MetaValue::I16(c.u16("i16 value")? as i16),
            vt::U32 => MetaValue::U32(c.u32("u32 value")?),
            vt::I32 => MetaValue::I32(c.u32("i32 value")? as i32),
            vt::U64 => MetaValue::U64(c.u64("u64 value")?),
            vt::I64 => MetaValue::I64(c.u64("i64 value")? as i64),
            vt::F32 => MetaValue::F32(f32::from_bits(c.u32("f32 value")?)),
            vt::F64 => MetaValue::F64(f64::from_bits(c.u64("f64 value")?)),
            vt::BOOL => {
                let at = c.pos;
                match c.u8("bool value")? {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    b => {
                        return Err(format!(
                            "bool value {b} at offset {at:#x} is neither 0 nor 1"
                        ))
                    }
                }
            }
            // Values are not lookup keys, and some converters emit vocabularies with
            // invalid UTF-8 in byte-fallback tokens; keep them readable rather than
            // rejecting an otherwise usable model.
            vt::STRING => {
                MetaValue::String(String::from_utf8_lossy(c.string_bytes("string")?).into_owned())
            }
            vt::ARRAY => self.array(depth)?,
            other => {
                return Err(format!(
                    "unknown value type {other} at offset {:#x}",
                    c.pos.saturating_sub(4)
                ))
            }
        })
    }

    fn array(&mut self, depth: u32) -> Result<MetaValue, String> {
        let c = &mut *self.cur;
        let at = c.pos;
        let elem_ty = c.u32("array element type")?;
        let count = c.u64("array length")?;
        let min = min_value_bytes(elem_ty)
            .ok_or_else(|| format!("array at offset {at:#x} has unknown element type {elem_ty}"))?;
        if elem_ty == vt::ARRAY && depth + 1 >= MAX_ARRAY_DEPTH {
            return Err(format!(
                "array at offset {at:#x} nests arrays deeper than {MAX_ARRAY_DEPTH} levels"
            ));
        }
        let remaining = c.remaining();
        let count = match usize::try_from(count) {
            Ok(n) if n <= remaining / min => n,
            _ => {
                return Err(format!(
                    "array count {count} of {} at offset {at:#x} needs at least {min} bytes each, \
                     but only {remaining} bytes remain",
                    value_type_name(elem_ty)
                ))
            }
        };
        if count > self.budget {
            return Err(format!(
                "array at offset {at:#x} with {count} elements exceeds the limit of {MAX_META_VALUES} metadata values per file"
            ));
        }
        self.budget -= count;
        let mut items = Vec::with_capacity(count.min(MAX_PREALLOC));
        for i in 0..count {
            items.push(
                self.value(elem_ty, depth + 1)
                    .map_err(|e| format!("element {i}: {e}"))?,
            );
        }
        Ok(MetaValue::Array(items))
    }
}

/// Tensor directory entry as read, before layout checks.
struct RawTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    rel_offset: u64,
}

pub(super) fn parse(path: &Path, buf: &[u8]) -> Result<Parsed> {
    let gguf_err = |reason: String| ModelError::Gguf {
        path: path.to_path_buf(),
        reason,
    };
    let mut c = Cursor { buf, pos: 0 };

    let magic = c.take(4, "magic").map_err(gguf_err)?;
    if magic != MAGIC {
        return Err(gguf_err(format!(
            "bad magic {:?} (bytes {:02x?}), expected \"GGUF\"",
            magic.escape_ascii().to_string(),
            magic
        )));
    }
    let version = c.u32("version").map_err(gguf_err)?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(gguf_err(
                "GGUF version 1 is not supported (only versions 2 and 3); \
                 re-convert the model with a current llama.cpp"
                    .to_string(),
            ))
        }
        v if matches!(v.swap_bytes(), 1..=3) => {
            return Err(gguf_err(format!(
                "big-endian GGUF (version field reads {} byte-swapped) is not supported",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(gguf_err(format!(
                "unsupported GGUF version {v} (supported: 2, 3)"
            )))
        }
    }
    let tensor_count = c.u64("tensor count").map_err(gguf_err)?;
    let kv_count = c.u64("metadata key/value count").map_err(gguf_err)?;
    let tensor_count = checked_count(tensor_count, c.remaining(), MIN_TENSOR_INFO_BYTES)
        .ok_or_else(|| {
            gguf_err(format!(
                "tensor count {tensor_count} is impossible: only {} bytes follow the header",
                c.remaining()
            ))
        })?;
    let kv_count = checked_count(kv_count, c.remaining(), MIN_KV_BYTES).ok_or_else(|| {
        gguf_err(format!(
            "metadata key/value count {kv_count} is impossible: only {} bytes follow the header",
            c.remaining()
        ))
    })?;

    // Metadata.
    let mut metadata = BTreeMap::new();
    let mut meta = MetaReader {
        cur: &mut c,
        budget: MAX_META_VALUES,
    };
    for i in 0..kv_count {
        let key = meta
            .cur
            .strict_string("key string")
            .map_err(|e| gguf_err(format!("key {i}: {e}")))?;
        let ctx = |e: String| gguf_err(format!("key {i} (`{key}`): {e}"));
        let ty = meta.cur.u32("value type").map_err(ctx)?;
        let value = meta.value(ty, 0).map_err(ctx)?;
        if metadata.contains_key(&key) {
            return Err(ctx("duplicate key".to_string()));
        }
        metadata.insert(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64().and_then(|a| usize::try_from(a).ok()) {
            Some(a) if a.is_power_of_two() && a <= u32::MAX as usize => a,
            _ => {
                return Err(gguf_err(format!(
                    "general.alignment {v} ({}) is not a power of two",
                    v.describe_type()
                )))
            }
        },
    };

    // Tensor directory.
    let mut raw = Vec::with_capacity(tensor_count.min(MAX_PREALLOC));
    for i in 0..tensor_count {
        let name = c
            .strict_string("tensor name")
            .map_err(|e| gguf_err(format!("tensor {i}: {e}")))?;
        let ctx = |e: String| gguf_err(format!("tensor {i} (`{name}`): {e}"));
        let at = c.pos;
        let n_dims = c.u32("dimension count").map_err(ctx)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(ctx(format!(
                "dimension count {n_dims} at offset {at:#x} is not between 1 and {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64("dimension").map_err(ctx)?);
        }
        let type_id = c.u32("tensor type").map_err(ctx)?;
        let rel_offset = c.u64("tensor data offset").map_err(ctx)?;
        raw.push(RawTensor {
            name,
            dims,
            type_id,
            rel_offset,
        });
    }

    let header_end = c.pos;
    let data_offset = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| {
            gguf_err(format!(
                "data section offset overflows (alignment {alignment})"
            ))
        })?;

    // Layout checks: types, shapes, sizes, alignment, bounds, uniqueness.
    let mut names = HashSet::with_capacity(raw.len());
    let mut tensors = Vec::with_capacity(raw.len());
    for (i, t) in raw.into_iter().enumerate() {
        let ctx = |e: String| gguf_err(format!("tensor {i} (`{}`): {e}", t.name));
        if !names.insert(t.name.clone()) {
            return Err(ctx("duplicate tensor name".to_string()));
        }
        let ty = GgmlType::from_id(t.type_id).ok_or_else(|| ModelError::UnsupportedTensorType {
            name: t.name.clone(),
            ty: format!(
                "id {} ({}) in {}; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K",
                t.type_id,
                ggml_type_name(t.type_id),
                path.display()
            ),
        })?;
        let dims: Vec<usize> = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d).ok().filter(|&d| d <= i64::MAX as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| ctx(format!("dimensions {:?} out of range", t.dims)))?;
        let n_elems = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| ctx(format!("element count of shape {dims:?} overflows")))?;
        let cols = dims[0];
        if !cols.is_multiple_of(ty.block_elems()) {
            return Err(ctx(format!(
                "row length {cols} is not a multiple of the {} block size {}",
                ty.name(),
                ty.block_elems()
            )));
        }
        // Not `GgmlType::row_bytes`: its multiplication is unchecked, and a corrupt row
        // length must be an error here, not an overflow.
        let row_bytes = (cols / ty.block_elems())
            .checked_mul(ty.block_bytes())
            .ok_or_else(|| {
                ctx(format!(
                    "byte size of a {cols}-element {} row overflows",
                    ty.name()
                ))
            })?;
        // Zero-sized dimensions are legal (an empty tensor) and simply hold no bytes.
        let rows = n_elems.checked_div(cols).unwrap_or(0);
        let n_bytes = row_bytes.checked_mul(rows).ok_or_else(|| {
            ctx(format!(
                "byte size of shape {dims:?} ({}) overflows",
                ty.name()
            ))
        })?;
        if t.rel_offset % alignment as u64 != 0 {
            return Err(ctx(format!(
                "data offset {} is not a multiple of the alignment {alignment}",
                t.rel_offset
            )));
        }
        let offset = usize::try_from(t.rel_offset)
            .ok()
            .and_then(|o| o.checked_add(data_offset))
            .filter(|&o| o.checked_add(n_bytes).is_some_and(|end| end <= buf.len()))
            .ok_or_else(|| {
                ctx(format!(
                    "data [{:#x}, +{n_bytes}) past end of file (size {})",
                    (data_offset as u64).saturating_add(t.rel_offset),
                    buf.len()
                ))
            })?;
        tensors.push(TensorInfo {
            name: t.name,
            ty,
            dims,
            offset,
            n_bytes,
        });
    }

    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// `count` as usize if `count` items of at least `min_bytes` each fit in `remaining`.
fn checked_count(count: u64, remaining: usize, min_bytes: usize) -> Option<usize> {
    usize::try_from(count)
        .ok()
        .filter(|&n| n <= remaining / min_bytes)
}
