//! GGUF v2/v3 model files: metadata, tensor directory and memory-mapped tensor data.
//!
//! Owns the public GGUF types ([`GgufFile`], [`MetaValue`], [`TensorInfo`]) and the typed
//! metadata accessors. The byte-level parser lives in `parse.rs`; it is written to
//! survive arbitrary (corrupt or hostile) input: every length and count is checked
//! against the bytes that remain before anything is allocated or read, so a bad file
//! produces a [`ModelError::Gguf`] naming what is wrong and where, never a panic.

mod parse;
pub mod write;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pagellm_kernels::quant::GgmlType;

use crate::config::Arch;
use crate::error::{ModelError, Result};
use crate::tensor::{Storage, Tensor, TensorSet};

/// Tensor data alignment used when a file has no `general.alignment` key.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// A typed GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// Short name of the value's type, as used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// Like [`type_name`](Self::type_name) but says what an array holds ("array of string").
    pub fn describe_type(&self) -> String {
        match self {
            MetaValue::Array(v) => match v.first() {
                Some(first) => format!("array of {}", first.describe_type()),
                None => "empty array".to_string(),
            },
            other => other.type_name().to_string(),
        }
    }

    /// The value as a non-negative integer, whatever its integer width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, whatever its integer width.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float; integers convert (some writers store e.g. `rope.freq_base`
    /// as an integer).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self
                .as_i64()
                .map(|v| v as f64)
                .or_else(|| self.as_u64().map(|v| v as f64)),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// Prints scalars plainly and long arrays abbreviated, for `inspect`-style listings.
impl fmt::Display for MetaValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        match self {
            MetaValue::U8(v) => write!(f, "{v}"),
            MetaValue::I8(v) => write!(f, "{v}"),
            MetaValue::U16(v) => write!(f, "{v}"),
            MetaValue::I16(v) => write!(f, "{v}"),
            MetaValue::U32(v) => write!(f, "{v}"),
            MetaValue::I32(v) => write!(f, "{v}"),
            MetaValue::U64(v) => write!(f, "{v}"),
            MetaValue::I64(v) => write!(f, "{v}"),
            MetaValue::F32(v) => write!(f, "{v}"),
            MetaValue::F64(v) => write!(f, "{v}"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::String(s) => write!(f, "{s:?}"),
            MetaValue::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().take(SHOWN).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                if items.len() > SHOWN {
                    write!(f, ", ... ({} items)", items.len())?;
                }
                f.write_str("]")
            }
        }
    }
}

/// Where one tensor lives in the file and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// GGML order: `dims[0]` is the contiguous row length. Always 1 to 4 entries.
    pub dims: Vec<usize>,
    /// Absolute file offset of the first byte (data section start + relative offset).
    pub offset: usize,
    /// Exact size of the data in bytes (checked to lie within the file).
    pub n_bytes: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> usize {
        // Cannot overflow: the parser rejected shapes whose product overflows.
        self.dims.iter().product()
    }
}

/// A parsed GGUF file. The tensor data is not copied: tensors are views into the
/// memory map (or owned buffer) shared through an `Arc`.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    /// Tensor data alignment (`general.alignment`, default 32).
    pub alignment: usize,
    /// Absolute offset of the data section.
    pub data_offset: usize,
    tensor_index: HashMap<String, usize>,
    storage: Arc<Storage>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("file_size", &self.file_size())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps `path` and parses its header; tensor data is paged in lazily.
    pub fn open(path: &Path) -> Result<Self> {
        let io_err = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        if len == 0 {
            // Mapping an empty file fails on some platforms; report it as what it is.
            return Err(ModelError::Gguf {
                path: path.to_path_buf(),
                reason: "file is empty".to_string(),
            });
        }
        // SAFETY: the map is read-only. Like every mmap-based loader we rely on the file
        // not being truncated or rewritten while it is open; doing so is a user error
        // that can at worst crash the process, and copying weights into RAM to rule it
        // out would double the memory cost of every model.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        Self::from_storage(path, Storage::Mmap(mmap))
    }

    /// Parses an in-memory GGUF image. `path_for_messages` only labels errors.
    pub fn parse_bytes(path_for_messages: &Path, bytes: Vec<u8>) -> Result<Self> {
        Self::from_storage(path_for_messages, Storage::Owned(bytes))
    }

    fn from_storage(path: &Path, storage: Storage) -> Result<Self> {
        let parsed = parse::parse(path, storage.bytes())?;
        let tensor_index = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            tensor_index,
            storage: Arc::new(storage),
        })
    }

    /// Size of the underlying file (or buffer) in bytes.
    pub fn file_size(&self) -> usize {
        self.storage.bytes().len()
    }

    /// The shared backing storage (memory map or buffer).
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&MetaValue> {
        self.get(key).ok_or_else(|| ModelError::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong_type(key: &str, expected: &'static str, found: &MetaValue) -> ModelError {
        let found = match found {
            // Out-of-range integers are the interesting case: say what the value was.
            v if v.as_i64().is_some() || v.as_u64().is_some() => {
                format!("{} (value {v}, out of range)", v.type_name())
            }
            v => v.describe_type(),
        };
        ModelError::WrongType {
            key: key.to_string(),
            expected,
            found,
        }
    }

    /// An integer key of any width whose value fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| Self::wrong_type(key, "u32", v))
    }

    /// An integer key of any width whose value is non-negative.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| Self::wrong_type(key, "u64", v))
    }

    /// An integer key of any width whose value fits in `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| Self::wrong_type(key, "usize", v))
    }

    /// An integer key of any width whose value fits in `i32`.
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        let v = self.require(key)?;
        v.as_i64()
            .and_then(|x| i32::try_from(x).ok())
            .ok_or_else(|| Self::wrong_type(key, "i32", v))
    }

    /// A float key (`f32` or `f64`; integers are accepted and converted).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| Self::wrong_type(key, "f32", v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong_type(key, "string", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| Self::wrong_type(key, "bool", v))
    }

    /// An array key of any element type.
    pub fn get_array(&self, key: &str) -> Result<&[MetaValue]> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
    }

    /// An array of strings (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let v = self.require(key)?;
        v.as_array()
            .and_then(|items| {
                items
                    .iter()
                    .map(MetaValue::as_str)
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| Self::wrong_type(key, "array of string", v))
    }

    /// An array of integers that fit in `i32` (`tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let v = self.require(key)?;
        v.as_array()
            .and_then(|items| {
                items
                    .iter()
                    .map(|x| x.as_i64().and_then(|x| i32::try_from(x).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| Self::wrong_type(key, "array of i32", v))
    }

    /// An array of floats (`tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let v = self.require(key)?;
        v.as_array()
            .and_then(|items| {
                items
                    .iter()
                    .map(|x| x.as_f64().map(|x| x as f32))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| Self::wrong_type(key, "array of f32", v))
    }

    /// `general.architecture`, parsed.
    pub fn architecture(&self) -> Result<Arch> {
        Arch::parse(self.get_str("general.architecture")?)
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// One tensor as a view into the shared storage.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        self.make_tensor(info)
    }

    fn make_tensor(&self, info: &TensorInfo) -> Result<Tensor> {
        Tensor::new(
            info.name.clone(),
            info.ty,
            info.dims.clone(),
            self.storage.clone(),
            info.offset,
        )
    }

    /// Every tensor, each a view sharing the memory map.
    pub fn tensor_set(&self) -> Result<TensorSet> {
        let mut set = TensorSet::default();
        for info in &self.tensors {
            set.insert(self.make_tensor(info)?);
        }
        Ok(set)
    }
}
