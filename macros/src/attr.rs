//! Parsing `#[distributed_lock("template", option = value, ...)]`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitBool, LitInt, LitStr, Path, Token};

/// Which lock the key names, and how it is taken.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Mutex,
    Read,
    Write,
    /// One permit of a semaphore of this many.
    Permits(u32),
}

/// The attribute's arguments, checked.
pub(crate) struct Args {
    pub(crate) template: LitStr,
    pub(crate) client: Option<Expr>,
    /// Milliseconds.
    pub(crate) timeout: Option<u64>,
    /// Milliseconds.
    pub(crate) ttl: Option<u64>,
    pub(crate) wait: bool,
    pub(crate) abort_on_lost: bool,
    pub(crate) krate: Option<Path>,
    pub(crate) mode: Mode,
}

const OPTIONS: &str = "client, timeout, ttl, wait, on_lost, crate, read, write, permits";

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.is_empty() {
            return Err(syn::Error::new(
                Span::call_site(),
                "#[distributed_lock] needs a key template, e.g. #[distributed_lock(\"orders:{order_id}\")]",
            ));
        }
        let template: LitStr = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "the first argument must be the key template, a string such as \"orders:{order_id}\"",
            )
        })?;
        let mut args = Args {
            template,
            client: None,
            timeout: None,
            ttl: None,
            wait: true,
            abort_on_lost: false,
            krate: None,
            mode: Mode::Mutex,
        };
        let mut seen: Vec<String> = Vec::new();
        let mut mode_span: Option<(String, Span)> = None;
        let mut timeout_span = None;
        let mut wait_set = None;
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let name = Ident::parse_any(input)?;
            let key = name.to_string();
            if seen.contains(&key) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("duplicate option `{key}`"),
                ));
            }
            if matches!(key.as_str(), "read" | "write" | "permits") {
                if let Some((other, _)) = &mode_span {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("`{key}` and `{other}` exclude each other: a key is a mutex, a read-write lock (`read` or `write`) or a semaphore (`permits = N`)"),
                    ));
                }
                mode_span = Some((key.clone(), name.span()));
            }
            if key == "read" || key == "write" {
                if input.peek(Token![=]) {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("`{key}` takes no value: write `{key}` to take the read-write lock for {}ing", if key == "read" { "read" } else { "writ" }),
                    ));
                }
                args.mode = if key == "read" {
                    Mode::Read
                } else {
                    Mode::Write
                };
                seen.push(key);
                continue;
            }
            input.parse::<Token![=]>()?;
            match key.as_str() {
                "permits" => {
                    let lit: LitInt = input.parse().map_err(|e| {
                        syn::Error::new(e.span(), "`permits` takes a whole number: the semaphore's number of permits, e.g. permits = 8")
                    })?;
                    let n: u32 = lit
                        .base10_parse()
                        .map_err(|_| syn::Error::new(lit.span(), "`permits` must fit in a u32"))?;
                    if n == 0 {
                        return Err(syn::Error::new(
                            lit.span(),
                            "a semaphore needs at least one permit",
                        ));
                    }
                    args.mode = Mode::Permits(n);
                }
                "client" => args.client = Some(input.parse()?),
                "timeout" => {
                    let lit: LitStr = input.parse()?;
                    timeout_span = Some(lit.span());
                    args.timeout = Some(duration(&lit)?);
                }
                "ttl" => args.ttl = Some(duration(&input.parse()?)?),
                "wait" => {
                    let lit: LitBool = input.parse()?;
                    args.wait = lit.value;
                    wait_set = Some(lit.span());
                }
                "on_lost" => {
                    let lit: LitStr = input.parse()?;
                    args.abort_on_lost = match lit.value().as_str() {
                        "abort" => true,
                        "ignore" => false,
                        other => {
                            return Err(syn::Error::new(
                                lit.span(),
                                format!("unknown on_lost `{other}`: expected \"abort\" (cancel the body once the lock is lost) or \"ignore\""),
                            ))
                        }
                    };
                }
                "crate" => {
                    let lit: LitStr = input.parse()?;
                    args.krate = Some(lit.parse().map_err(|_| {
                        syn::Error::new(lit.span(), "`crate` must name a path, e.g. \"::distlock\"")
                    })?);
                }
                _ => {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("unknown option `{key}`; expected one of: {OPTIONS}"),
                    ))
                }
            }
            seen.push(key);
        }
        if let (false, Some(span), Some(_)) = (args.wait, timeout_span, wait_set) {
            return Err(syn::Error::new(
                span,
                "`timeout` has no effect with `wait = false`, which tries once",
            ));
        }
        Ok(args)
    }
}

/// "5s", "250ms", "1.5s", "2m", "1h" → milliseconds, checked at compile time.
fn duration(lit: &LitStr) -> syn::Result<u64> {
    let text = lit.value();
    let bad = |why: &str| {
        syn::Error::new(
            lit.span(),
            format!("invalid duration \"{text}\": {why}; write a number and a unit (ms, s, m, h), e.g. \"5s\" or \"250ms\""),
        )
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| bad("no unit"))?;
    let (number, unit) = t.split_at(split);
    let factor = match unit.trim() {
        "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        "h" => 3600e3,
        _ => return Err(bad("unknown unit")),
    };
    let value: f64 = number.parse().map_err(|_| bad("not a number"))?;
    let millis = value * factor;
    if !(millis >= 1.0 && millis <= u32::MAX as f64) {
        return Err(bad("out of range (1ms to about 49 days)"));
    }
    Ok(millis.round() as u64)
}

/// The argument names a key template uses, checked against `known`.
pub(crate) fn placeholders(template: &LitStr, known: &[String]) -> syn::Result<()> {
    let text = template.value();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '{' => {
                let mut inner = String::new();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                    inner.push(c);
                }
                let name = inner.split(':').next().unwrap_or_default().trim();
                if name.is_empty() {
                    return Err(syn::Error::new(
                        template.span(),
                        "empty placeholder `{}`: name an argument, e.g. {order_id}",
                    ));
                }
                if !known.iter().any(|k| k == name) {
                    return Err(syn::Error::new(
                        template.span(),
                        format!(
                            "unknown placeholder `{{{name}}}`: no argument of this function is named `{name}` (arguments: {})",
                            if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}
