//! Errors of the GPU plumbing.

/// What went wrong on the device. `gphash` reports each as its own error of the same name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No Vulkan adapter could be opened.
    #[error("no GPU: {0}")]
    NoAdapter(String),
    /// The adapter lacks a feature the kernels need.
    #[error("missing GPU feature: {0}")]
    MissingFeature(String),
    /// A WGSL kernel failed to build.
    #[error("shader: {0}")]
    Shader(String),
    /// The GPU or the driver failed.
    #[error("GPU: {0}")]
    Gpu(String),
    /// A request the device cannot serve (too many bindings, a pool too large).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
}

/// Result of the GPU plumbing.
pub type Result<T> = std::result::Result<T, Error>;
