//! WGSL sources: a tiny `#include` preprocessor that stitches kernel files with a table's
//! generated prelude (its constants, bindings and window accessors), the pieces of a prelude
//! that every table shares, the WGSL files every table's kernels may include, and validation
//! with naga.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use crate::error::{Error, Result};

/// Invocations per workgroup: a multiple of every subgroup size up to 128.
pub const WORKGROUP: u32 = 128;

/// Named WGSL files, embedded at build time.
pub type Files = &'static [(&'static str, &'static str)];

/// The files any table's kernels may include or run: operation codes and invocations
/// (`common/ops.wgsl`), writes of the pool's windows and the dirty-line list (`pool`), the key
/// hash (`hash`), tiles of lanes (`tile`), bitmap allocators (`bitmap`), the claim registry
/// (`claims`), new values (`values`), and the staged write-back kernel (`writeback.wgsl`).
pub const SHARED: Files = &[
    ("writeback.wgsl", include_str!("../shaders/writeback.wgsl")),
    ("common/bitmap.wgsl", include_str!("../shaders/common/bitmap.wgsl")),
    ("common/claims.wgsl", include_str!("../shaders/common/claims.wgsl")),
    ("common/hash.wgsl", include_str!("../shaders/common/hash.wgsl")),
    ("common/ops.wgsl", include_str!("../shaders/common/ops.wgsl")),
    ("common/pool.wgsl", include_str!("../shaders/common/pool.wgsl")),
    ("common/tile.wgsl", include_str!("../shaders/common/tile.wgsl")),
    ("common/values.wgsl", include_str!("../shaders/common/values.wgsl")),
];

/// A compute entry point of some table's kernels.
pub trait KernelEntry: Copy + PartialEq + std::fmt::Debug {
    /// The file it lives in.
    fn file(self) -> &'static str;
    /// Its entry point.
    fn entry(self) -> &'static str;
}

/// How a region is split into storage bindings: `count` windows of `2^shift` words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// Number of bindings.
    pub count: u32,
    /// log2 of the words per window.
    pub shift: u32,
}

impl Windows {
    /// Windows of at most `max_bytes` bytes (a power of two is used) covering `words` words.
    pub fn cover(words: u64, max_bytes: u64) -> Windows {
        let shift = (max_bytes / 4).max(64).ilog2();
        Windows { count: words.div_ceil(1 << shift).max(1) as u32, shift }
    }

    /// Words per window.
    pub fn words(&self) -> u64 {
        1 << self.shift
    }

    /// Words of window `i` of a region of `total` words.
    pub fn len(&self, i: u32, total: u64) -> u64 {
        (total - i as u64 * self.words()).min(self.words())
    }
}

/// How the kernels reach a pool's regions. A word address (the prelude's `Word`) of 32 bits
/// reaches 2^32 words (16 GiB) a region; 64 bits any size, on devices with
/// `wgpu::Features::SHADER_INT64`. A region's windows are a binding each, as many as the
/// device allows storage bindings, or one binding array (`BUFFER_BINDING_ARRAY` and
/// `STORAGE_RESOURCE_BINDING_ARRAY`), as many as it allows array elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// `Word` is `u64`, not `u32`.
    pub wide: bool,
    /// Each region's windows are one binding array.
    pub arrays: bool,
}

impl Reach {
    /// The WGSL type of a word address.
    pub fn word_type(self) -> &'static str {
        if self.wide { "u64" } else { "u32" }
    }

    /// `v` as a WGSL literal of that type.
    pub fn word(self, v: u64) -> String {
        if self.wide { format!("{v}lu") } else { format!("{v}u") }
    }

    /// The directives the top of a source with these windows needs.
    pub fn enables(self) -> &'static str {
        if self.arrays { "enable wgpu_binding_array;\n" } else { "" }
    }
}

/// The constants of a prelude: those of every table, which the shared files use (`WG`, `TILE`,
/// `KEY_WORDS`; `VALUE_WORDS`, a value's words in batch buffers, and `CELL_WORDS`, the words
/// of a heap cell: the value, then its checksum when the table keeps one), then the table's
/// own `consts`.
pub fn write_consts(
    s: &mut String,
    tile: u32,
    key_words: u32,
    (value_words, cell_words): (u32, u32),
    consts: &[(&str, u64)],
) {
    let shared = [
        ("WG", WORKGROUP),
        ("TILE", tile),
        ("KEY_WORDS", key_words),
        ("VALUE_WORDS", value_words),
        ("CELL_WORDS", cell_words),
    ];
    for (name, v) in shared.into_iter().map(|(n, v)| (n, v as u64)).chain(consts.iter().copied()) {
        writeln!(s, "const {name}: u32 = {v}u;").unwrap();
    }
}

/// The bindings of a batch, the same for every table: its parameters (a `Params` struct each
/// table's prelude declares, passed as immediates), then its operations and their results in
/// bind group [`BATCH_GROUP`].
pub const BATCH_BINDINGS: &str = "
var<immediate> params: Params;
@group(1) @binding(0) var<storage, read> kinds: array<u32>;
@group(1) @binding(1) var<storage, read> keys: array<u32>;
@group(1) @binding(2) var<storage, read> vals_in: array<u32>;
@group(1) @binding(3) var<storage, read_write> statuses: array<u32>;
@group(1) @binding(4) var<storage, read_write> vals_out: array<u32>;
";

/// The bind group of a batch's buffers, apart from the table's (group 0): a batch in buffers of
/// its own (a device batch) gets a bind group of these five, not of the table's dozens.
pub const BATCH_GROUP: u32 = 1;

/// Buffers in the batch's bind group: kinds, keys and input values (read-only), statuses and
/// found values.
pub const BATCH_BUFFERS: u32 = 5;

/// The bindings of read-write regions split in windows (name, whether its words are atomic,
/// windows), from binding `first` on, and their accessors: `{name}_load`, `{name}_store`, and
/// for atomic regions `{name}_cas_weak`, `{name}_or` and `{name}_and`, which take a `Word`
/// address (declared here, as `reach` says). Returns the next free binding.
pub fn write_windows(s: &mut String, first: u32, regions: &[(&str, bool, Windows)], reach: Reach) -> u32 {
    writeln!(s, "alias Word = {};", reach.word_type()).unwrap();
    if reach.arrays {
        s.push_str(
            "struct Words {\n    w: array<u32>,\n}\nstruct AtomicWords {\n    w: array<atomic<u32>>,\n}\n",
        );
    }
    let mut binding = first;
    for &(name, atomic, w) in regions {
        binding = declare_windows(s, binding, name, (atomic, false), w, reach);
    }
    for &(name, atomic, w) in regions {
        let fns = if atomic {
            vec![
                ("load(a: Word) -> u32", "return atomicLoad(&{word});"),
                ("store(a: Word, v: u32)", "atomicStore(&{word}, v); return;"),
                (
                    "cas_weak(a: Word, expected: u32, v: u32) -> vec2<u32>",
                    "let r = atomicCompareExchangeWeak(&{word}, expected, v); return vec2<u32>(r.old_value, u32(r.exchanged));",
                ),
                ("or(a: Word, v: u32) -> u32", "return atomicOr(&{word}, v);"),
                ("and(a: Word, v: u32)", "atomicAnd(&{word}, v); return;"),
            ]
        } else {
            vec![
                ("load(a: Word) -> u32", "return {word};"),
                ("store(a: Word, v: u32)", "{word} = v; return;"),
            ]
        };
        for (sig, body) in fns {
            accessor(s, &format!("{name}_{sig}"), body, (name, w), reach);
        }
    }
    binding
}

/// Declares the windows of region `name` from binding `binding` on (their words atomic, the
/// region read-only); returns the next free binding.
pub fn declare_windows(
    s: &mut String,
    binding: u32,
    name: &str,
    (atomic, read_only): (bool, bool),
    w: Windows,
    reach: Reach,
) -> u32 {
    let access = if read_only { "read" } else { "read_write" };
    if reach.arrays {
        let ty = if atomic { "AtomicWords" } else { "Words" };
        let decl = format!("var<storage, {access}> {name}_w: binding_array<{ty}, {}>;", w.count);
        writeln!(s, "@group(0) @binding({binding}) {decl}").unwrap();
        return binding + 1;
    }
    let ty = if atomic { "atomic<u32>" } else { "u32" };
    for i in 0..w.count {
        writeln!(s, "@group(0) @binding({}) var<storage, {access}> {name}_w{i}: array<{ty}>;", binding + i)
            .unwrap();
    }
    binding + w.count
}

/// A function that routes word address `a` (a `Word`) to its window of region `name`: `body`
/// with `{word}` the word in its window.
pub fn accessor(s: &mut String, signature: &str, body: &str, (name, w): (&str, Windows), reach: Reach) {
    let inner = match (w.count, reach.wide) {
        (1, false) => "a".to_string(),
        (1, true) => "u32(a)".to_string(),
        (_, false) => format!("a & {}u", w.words() - 1),
        (_, true) => format!("u32(a & {}lu)", w.words() - 1),
    };
    writeln!(s, "fn {signature} {{").unwrap();
    if reach.arrays {
        let word = format!("{name}_w[u32(a >> {}u)].w[{inner}]", w.shift);
        writeln!(s, "    {}", body.replace("{word}", &word)).unwrap();
    } else if w.count == 1 {
        writeln!(s, "    {}", body.replace("{word}", &format!("{name}_w0[{inner}]"))).unwrap();
    } else {
        writeln!(s, "    switch (u32(a >> {}u)) {{", w.shift).unwrap();
        for i in 1..w.count {
            writeln!(
                s,
                "        case {i}u: {{ {} }}",
                body.replace("{word}", &format!("{name}_w{i}[{inner}]"))
            )
            .unwrap();
        }
        writeln!(s, "        default: {{ {} }}", body.replace("{word}", &format!("{name}_w0[{inner}]")))
            .unwrap();
        writeln!(s, "    }}").unwrap();
    }
    writeln!(s, "}}").unwrap();
}

/// The source of `file`: each file it `#include`s, from `files`, expanded in place once;
/// `common/prelude.wgsl` is a table's generated `prelude`.
///
/// A file that relies on names it neither declares nor includes (the prelude's bindings and
/// constants, another file's functions) says so in a line `// uses: a, b, params.field`; each
/// must be declared at the top level of the stitched source (`params.field`: a member of the
/// struct of the variable `params`), or the error names the file and the name.
pub fn stitch(file: &str, prelude: &str, files: &[Files]) -> Result<String> {
    let mut out = String::new();
    let mut uses = Vec::new();
    expand(file, prelude, files, &mut HashSet::new(), &mut uses, &mut out)?;
    let declared = declarations(&out);
    match uses.into_iter().find(|(_, name)| !declared.contains(name)) {
        Some((user, name)) => Err(Error::Shader(format!(
            "{user} uses {name}, which the source stitched for {file} does not declare"
        ))),
        None => Ok(out),
    }
}

fn expand(
    file: &str,
    prelude: &str,
    files: &[Files],
    seen: &mut HashSet<String>,
    uses: &mut Vec<(String, String)>,
    out: &mut String,
) -> Result<()> {
    if !seen.insert(file.to_string()) {
        return Ok(());
    }
    let text = if file == "common/prelude.wgsl" {
        prelude
    } else {
        files
            .iter()
            .flat_map(|f| f.iter())
            .find(|(name, _)| *name == file)
            .map(|(_, text)| *text)
            .ok_or_else(|| Error::Shader(format!("#include of unknown shader file {file}")))?
    };
    for line in text.lines() {
        if let Some(names) = line.trim().strip_prefix("// uses:") {
            uses.extend(names.split(',').map(|n| (file.to_string(), n.trim().to_string())));
        }
        match line.trim().strip_prefix("#include") {
            Some(rest) => expand(rest.trim().trim_matches('"'), prelude, files, seen, uses, out)?,
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(())
}

/// The names `src` declares at its top level (lines that start a declaration in column 0), and
/// `var.member` for each member of a variable whose type is a struct declared there.
fn declarations(src: &str) -> HashSet<String> {
    let ident = |s: &str| {
        s.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or_default().to_string()
    };
    let mut names = HashSet::new();
    let mut structs: HashMap<String, Vec<String>> = HashMap::new();
    let mut vars = Vec::new();
    let mut open_struct: Option<String> = None;
    for line in src.lines() {
        if let Some(name) = &open_struct {
            match line.trim() {
                "}" | "};" => open_struct = None,
                member if !member.is_empty() && !member.starts_with("//") && member.contains(':') => {
                    structs.entry(name.clone()).or_default().push(ident(member));
                }
                _ => {}
            }
            continue;
        }
        let decl = line.split_whitespace().skip_while(|t| t.starts_with('@')).collect::<Vec<_>>().join(" ");
        let Some((keyword, rest)) = decl.split_once(' ') else { continue };
        let rest = match keyword {
            "const" | "override" | "fn" | "alias" | "struct" | "var" => rest,
            // `var<storage, read> name: ...`
            _ if keyword.starts_with("var<") => rest.split_once("> ").map_or(rest, |(_, r)| r),
            _ => continue,
        };
        let name = ident(rest);
        if keyword == "struct" {
            open_struct = Some(name.clone());
        } else if keyword.starts_with("var")
            && let Some((_, ty)) = rest.split_once(':')
        {
            vars.push((name.clone(), ident(ty.trim())));
        }
        names.insert(name);
    }
    for (var, ty) in vars {
        names.extend(structs.get(&ty).into_iter().flatten().map(|m| format!("{var}.{m}")));
    }
    names
}

/// Parses and validates the source `src` of `file` with naga, as wgpu will (immediates, 64-bit
/// integers and binding arrays allowed, as a wide [`Reach`] needs them); the error names the file.
pub fn check(file: &str, src: &str) -> Result<naga::Module> {
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| Error::Shader(format!("{file}: {}", e.emit_to_string(src))))?;
    use naga::valid::Capabilities as C;
    let caps = C::SUBGROUP
        | C::IMMEDIATES
        | C::SHADER_INT64
        | C::BUFFER_BINDING_ARRAY
        | C::STORAGE_BUFFER_BINDING_ARRAY
        | C::STORAGE_BUFFER_BINDING_ARRAY_NON_UNIFORM_INDEXING;
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| Error::Shader(format!("{file}: {}", e.emit_to_string(src))))?;
    Ok(module)
}

/// The `u32` constants of `module` by name, for tests that compare WGSL constants with their
/// Rust twins.
pub fn u32_consts(module: &naga::Module) -> HashMap<String, u32> {
    module
        .constants
        .iter()
        .filter_map(|(_, c)| match module.global_expressions[c.init] {
            naga::Expression::Literal(naga::Literal::U32(v)) => Some((c.name.clone()?, v)),
            _ => None,
        })
        .collect()
}

/// The names of the constants `text` (one WGSL file) declares at its top level.
pub fn declared_consts(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|line| line.strip_prefix("const "))
        .map(|rest| rest.split([':', ' ', '=']).next().unwrap_or_default())
        .collect()
}

/// A struct's size and its members' names and byte offsets, in order.
pub type StructLayout = (usize, Vec<(String, usize)>);

/// The layout of the WGSL struct `name` in `module`, as the shader sees it; tests compare it with
/// its `#[repr(C)]` Rust twin's ([`rust_layout!`](crate::rust_layout)).
pub fn wgsl_layout(module: &naga::Module, name: &str) -> Option<StructLayout> {
    module.types.iter().find_map(|(_, ty)| match &ty.inner {
        naga::TypeInner::Struct { members, span } if ty.name.as_deref() == Some(name) => Some((
            *span as usize,
            members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize)).collect(),
        )),
        _ => None,
    })
}

/// The [`StructLayout`] of a `#[repr(C)]` struct, given every field in order: the fields are
/// named in an exhaustive pattern, so a field added to the struct and not here fails to compile.
#[macro_export]
macro_rules! rust_layout {
    ($ty:ident { $($field:ident),* $(,)? }) => {{
        let _every_field = |v: $ty| {
            let $ty { $($field: _),* } = v;
        };
        let layout: $crate::shader::StructLayout = (
            ::std::mem::size_of::<$ty>(),
            vec![$((stringify!($field).to_string(), ::std::mem::offset_of!($ty, $field))),*],
        );
        layout
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_region() {
        let w = Windows::cover(1000, 1024);
        assert_eq!((w.count, w.words()), (4, 256));
        assert_eq!(w.len(3, 1000), 232);
        assert_eq!(Windows::cover(10, 1 << 30).count, 1);
    }

    #[test]
    fn uses_must_be_declared() {
        let files: Files = &[
            ("main.wgsl", "#include \"common/prelude.wgsl\"\n#include \"lib.wgsl\"\nfn main() {}\n"),
            ("lib.wgsl", "// uses: WG, params.n, counters, helper\nfn lib() {}\n"),
        ];
        let prelude = "const WG: u32 = 1u;\nstruct P {\n    n: u32,\n}\n@group(0) @binding(0) var<uniform> params: P;\n@group(0) @binding(1) var<storage, read_write> counters: array<u32>;\n";
        let missing = |prelude: &str| match stitch("main.wgsl", prelude, &[files]) {
            Err(Error::Shader(e)) => e,
            other => panic!("{other:?}"),
        };
        assert!(missing(prelude).contains("lib.wgsl uses helper"), "{}", missing(prelude));
        let full = format!("{prelude}fn helper() {{}}\n");
        assert!(stitch("main.wgsl", &full, &[files]).is_ok());
        assert!(missing(&full.replace("n: u32", "m: u32")).contains("lib.wgsl uses params.n"));
        assert!(missing(&full.replace("counters", "other")).contains("lib.wgsl uses counters"));
    }
}
