// `python:` stages embed the interpreter: the binary and its tests find libpython where it
// was linked (a pyenv or venv build keeps it outside the loader's default paths).
fn main() {
    #[cfg(feature = "python")]
    pyo3_build_config::add_libpython_rpath_link_args();
}
