//! Errors of the GPU plumbing, and the wgpu error scopes that turn device errors into them.

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

/// wgpu's error scopes of every kind, pushed together: a validation, out-of-memory or internal
/// error raised on this thread while they are pushed is captured here instead of going to the
/// device's uncaptured-error log while the kernels run on invalid buffers and return garbage.
pub struct ErrorScopes(Vec<wgpu::ErrorScopeGuard>);

impl ErrorScopes {
    /// Pushes the scopes.
    pub fn push(dev: &wgpu::Device) -> Self {
        let filters =
            [wgpu::ErrorFilter::Internal, wgpu::ErrorFilter::OutOfMemory, wgpu::ErrorFilter::Validation];
        ErrorScopes(filters.into_iter().map(|f| dev.push_error_scope(f)).collect())
    }

    /// Pops the scopes: `Error::Gpu` naming `what` if any of them captured an error.
    pub fn pop(mut self, what: impl FnOnce() -> String) -> Result<()> {
        let mut first = None;
        // wgpu wants scopes popped in reverse order.
        while let Some(scope) = self.0.pop() {
            if let Some(e) = pollster::block_on(scope.pop()) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), |e| Err(Error::Gpu(format!("{}: {e}", what()))))
    }
}

impl Drop for ErrorScopes {
    fn drop(&mut self) {
        // Scopes left by an early return: popped in reverse order, their errors dropped (the
        // return carries its own error).
        while let Some(scope) = self.0.pop() {
            drop(scope);
        }
    }
}

/// Runs `f` under [`ErrorScopes`]: its value, or `Error::Gpu` naming `what` if it raised a
/// wgpu error.
pub fn scoped<T>(dev: &wgpu::Device, what: &str, f: impl FnOnce() -> T) -> Result<T> {
    let scopes = ErrorScopes::push(dev);
    let value = f();
    scopes.pop(|| what.to_string())?;
    Ok(value)
}

/// Runs `f` under an out-of-memory error scope: its value, and the device's out-of-memory
/// error if it raised one (other errors go to the scopes around it).
pub fn catch_out_of_memory<T>(dev: &wgpu::Device, f: impl FnOnce() -> T) -> (T, Option<String>) {
    let scope = dev.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let value = f();
    (value, pollster::block_on(scope.pop()).map(|e| e.to_string()))
}
