//! GBNF (llama.cpp's grammar format) rewritten as llguidance's Lark dialect, so that a
//! grammar written for llama-server works here unchanged.
//!
//! The two formats share strings, grouping, alternation and repetition (`* + ? {m,n}`);
//! what differs is spelled differently: `name ::= …` becomes `name: …` (one line per
//! rule), `root` becomes `start`, character classes `[…]` and `.` become regexes, and
//! rule names are lowercased (Lark reads capitalised names as terminals).

/// The Lark form of GBNF grammar `src`, or what is wrong with it.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let toks = lex(src)?;
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match (&toks[i], toks.get(i + 1)) {
            (Tok::Name(n), Some(Tok::Define)) => {
                rules.push((rule_name(n), Vec::new()));
                i += 2;
            }
            (t, _) => {
                let Some((_, body)) = rules.last_mut() else {
                    return Err(format!(
                        "expected a rule (`name ::= ...`) at the start, found {}",
                        t.text()
                    ));
                };
                body.push(match t {
                    Tok::Name(n) => rule_name(n),
                    t => t.text(),
                });
                i += 1;
            }
        }
    }
    if rules.is_empty() {
        return Err("the grammar has no rules".into());
    }
    if !rules.iter().any(|(n, _)| n == "start") {
        return Err("the grammar has no `root` rule".into());
    }
    let mut out = String::new();
    for (name, body) in rules {
        if body.is_empty() {
            return Err(format!("rule `{name}` is empty"));
        }
        out.push_str(&format!("{name}: {}\n", body.join(" ")));
    }
    Ok(out)
}

fn rule_name(n: &str) -> String {
    if n == "root" {
        "start".into()
    } else {
        n.to_ascii_lowercase()
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Define,
    /// A string literal, in JSON syntax.
    Str(String),
    /// A regex (character class or `.`), between slashes.
    Regex(String),
    /// `( ) | * + ?` or a `{m,n}` repetition, verbatim.
    Op(String),
}

impl Tok {
    fn text(&self) -> String {
        match self {
            Tok::Name(s) | Tok::Str(s) | Tok::Regex(s) | Tok::Op(s) => s.clone(),
            Tok::Define => "::=".into(),
        }
    }
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let cs: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let line_of = |i: usize| cs[..i].iter().filter(|&&c| c == '\n').count() + 1;
    while i < cs.len() {
        let c = cs[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < cs.len() && cs[i] != '\n' {
                    i += 1;
                }
            }
            ':' if cs[i..].starts_with(&[':', ':', '=']) => {
                out.push(Tok::Define);
                i += 3;
            }
            '"' => {
                let (s, end) = string(&cs, i).map_err(|e| format!("line {}: {e}", line_of(i)))?;
                out.push(Tok::Str(
                    serde_json::to_string(&s).expect("a string serializes"),
                ));
                i = end;
            }
            '[' => {
                let start = i;
                i += 1;
                while i < cs.len() && cs[i] != ']' {
                    i += if cs[i] == '\\' { 2 } else { 1 };
                }
                if i >= cs.len() {
                    return Err(format!("line {}: unclosed `[`", line_of(start)));
                }
                i += 1;
                let class: String = cs[start..i].iter().collect();
                out.push(Tok::Regex(format!("/{}/", class.replace('/', "\\/"))));
            }
            '.' => {
                out.push(Tok::Regex("/(?s:.)/".into()));
                i += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                out.push(Tok::Op(c.to_string()));
                i += 1;
            }
            '{' => {
                let start = i;
                while i < cs.len() && cs[i] != '}' {
                    i += 1;
                }
                if i >= cs.len() {
                    return Err(format!("line {}: unclosed `{{`", line_of(start)));
                }
                i += 1;
                let rep: String = cs[start..i].iter().filter(|c| !c.is_whitespace()).collect();
                out.push(Tok::Op(rep));
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = i;
                while i < cs.len()
                    && (cs[i].is_ascii_alphanumeric() || cs[i] == '-' || cs[i] == '_')
                {
                    i += 1;
                }
                out.push(Tok::Name(cs[start..i].iter().collect()));
            }
            c => return Err(format!("line {}: unexpected `{c}`", line_of(i))),
        }
    }
    Ok(out)
}

/// The string literal starting at `cs[i]` (a `"`), decoded, and the index after it.
fn string(cs: &[char], mut i: usize) -> Result<(String, usize), String> {
    let mut s = String::new();
    i += 1;
    loop {
        let Some(&c) = cs.get(i) else {
            return Err("unclosed string".into());
        };
        i += 1;
        match c {
            '"' => return Ok((s, i)),
            '\\' => {
                let Some(&e) = cs.get(i) else {
                    return Err("unclosed string".into());
                };
                i += 1;
                let hex = |n: usize, i: &mut usize| -> Result<char, String> {
                    let h: String = cs.get(*i..*i + n).ok_or("short escape")?.iter().collect();
                    *i += n;
                    u32::from_str_radix(&h, 16)
                        .ok()
                        .and_then(char::from_u32)
                        .ok_or_else(|| format!("bad escape `\\{e}{h}`"))
                };
                s.push(match e {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'x' => hex(2, &mut i)?,
                    'u' => hex(4, &mut i)?,
                    'U' => hex(8, &mut i)?,
                    other => other,
                });
            }
            c => s.push(c),
        }
    }
}
