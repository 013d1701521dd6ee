//! The Python interpreter a stage runs in: the one that loaded `riffle` (from Python), or one
//! the `riffle` binary starts in its own process (from the CLI).

use std::path::Path;
use std::sync::Once;

use pyo3::prelude::*;
use pyo3::types::PyList;

/// Starts the interpreter unless one runs already. A started one sees the active virtual
/// environment's packages (`VIRTUAL_ENV`, as `python` would), since an embedded interpreter
/// knows only its own installation's.
pub(crate) fn ensure() -> PyResult<()> {
    static START: Once = Once::new();
    let mut result = Ok(());
    START.call_once(|| {
        // SAFETY: a plain query of the interpreter's state, valid before initialization.
        let running = unsafe { pyo3::ffi::Py_IsInitialized() } != 0;
        if running {
            return;
        }
        Python::initialize();
        if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
            result = Python::attach(|py| add_virtualenv(py, Path::new(&venv)));
        }
    });
    result
}

fn add_virtualenv(py: Python<'_>, venv: &Path) -> PyResult<()> {
    let version = py.version_info();
    let site = venv
        .join("lib")
        .join(format!("python{}.{}", version.major, version.minor))
        .join("site-packages");
    if !site.is_dir() {
        // A venv of another Python version: its packages cannot load in this interpreter.
        tracing::warn!(
            "python: VIRTUAL_ENV={} has no {} (this riffle embeds Python {}.{}): its packages \
             are not used",
            venv.display(),
            site.display(),
            version.major,
            version.minor
        );
        return Ok(());
    }
    py.import("site")?
        .call_method1("addsitedir", (site.to_string_lossy().as_ref(),))?;
    Ok(())
}

/// Puts `dir` first on `sys.path`, once, so a stage's file imports its neighbours.
pub(crate) fn add_path(py: Python<'_>, dir: &Path) -> PyResult<()> {
    let path = py.import("sys")?.getattr("path")?.cast_into::<PyList>()?;
    let dir = dir.to_string_lossy();
    if !path.contains(dir.as_ref())? {
        path.insert(0, dir.as_ref())?;
    }
    Ok(())
}

/// What a Python exception says on a traceback's last line (`ValueError: bad row`).
pub(crate) fn reason(py: Python<'_>, e: &PyErr) -> String {
    let kind = e
        .get_type(py)
        .name()
        .map_or_else(|_| "Exception".to_string(), |n| n.to_string());
    let value = e
        .value(py)
        .str()
        .map_or_else(|_| String::new(), |s| s.to_string());
    if value.is_empty() {
        kind
    } else {
        format!("{kind}: {value}")
    }
}
