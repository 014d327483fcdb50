//! A page of the book as these tests read it: its shell blocks, the files
//! it asks the reader to save, the output it shows after each command, and
//! how a shown output is compared with the real one.
//!
//! - Every ` ```sh ` block runs, in page order. A shell block spelt other
//!   than ` ```sh ` (`bash`, `console`, `sh,ignore`, ...) is an error, so
//!   that nothing meant to run is left out quietly.
//! - A directive comment right before a block changes that:
//!   `<!-- test: skip, REASON -->` leaves a ` ```sh ` block out,
//!   `<!-- test: after the checks -->` runs it once the test has checked
//!   what the page promises (its clean-up), `<!-- test: at the end -->` runs
//!   it last of all, after any page that continues from this one, and
//!   `<!-- test: file PATH -->` before any other code block (` ```python `,
//!   ` ```toml `, ...) writes that block to PATH at that point, as the reader
//!   saves it. A directive not followed by a block it fits is an error.
//! - A ` ```text ` block shows the output of the last ` ```sh ` block before
//!   it, and is compared with what that block printed (stdout and stderr),
//!   line by line, after times and ids are replaced by placeholders
//!   (`<time>`, `<duration>`, `<relay>`, `<uuid>`), runs of spaces are made
//!   one and blank lines dropped. A line `...` stands for any number of
//!   lines, and `...` within a line for any text. The background
//!   `demo-receiver` prints when a request reaches it, which may be while a
//!   later command runs, even in the middle of that command's line: such a
//!   line is taken out whole (`unweave`), and a block that shows no
//!   `receiver:` line is compared without them.

/// When a block of a page runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// In page order.
    InOrder,
    /// Not at all (`test: skip, REASON`).
    Skip,
    /// After the test's checks (`test: after the checks`).
    AfterChecks,
    /// Last of all (`test: at the end`).
    AtEnd,
    /// Written to this file, in page order (`test: file PATH`).
    File(String),
}

/// An output block (` ```text `) and the 1-based line of its fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub line: usize,
    pub text: String,
}

#[derive(Debug)]
pub struct Block {
    /// 1-based line of the opening fence.
    pub line: usize,
    pub run: Run,
    pub text: String,
    /// The output blocks that follow it, before the next shell block.
    pub shown: Vec<Shown>,
}

/// The blocks of `page` (named `name` in messages): its shell blocks and
/// the files it saves, each with the output shown after it.
pub fn blocks(name: &str, page: &str) -> Vec<Block> {
    let lines: Vec<&str> = page.lines().collect();
    let mut blocks: Vec<Block> = Vec::new();
    let mut directive: Option<(usize, Run)> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if let Some(rest) = line.strip_prefix("<!-- test:") {
            let what = rest.trim().trim_end_matches("-->").trim();
            let run = if let Some(reason) = what.strip_prefix("skip,") {
                assert!(
                    !reason.trim().is_empty(),
                    "{name}:{}: a skip names no reason",
                    i + 1
                );
                Run::Skip
            } else if let Some(path) = what.strip_prefix("file ") {
                Run::File(path.trim().to_string())
            } else if what == "after the checks" {
                Run::AfterChecks
            } else if what == "at the end" {
                Run::AtEnd
            } else {
                panic!(
                    "{name}:{}: unknown directive {line:?} (`<!-- test: skip, REASON -->`, \
                     `<!-- test: after the checks -->`, `<!-- test: at the end -->` or \
                     `<!-- test: file PATH -->`)",
                    i + 1
                )
            };
            assert!(
                directive.is_none(),
                "{name}:{}: two directives for one block",
                i + 1
            );
            directive = Some((i + 1, run));
            i += 1;
            continue;
        }
        if let Some(info) = lines[i].strip_prefix("```") {
            let info = info.trim();
            let end = (i + 1..lines.len())
                .find(|&j| lines[j].trim_start().starts_with("```"))
                .unwrap_or_else(|| panic!("{name}:{}: a fence that is never closed", i + 1));
            let text = lines[i + 1..end].join("\n");
            let lang = info
                .split([' ', ',', '{'])
                .next()
                .unwrap_or("")
                .to_lowercase();
            let shell = matches!(
                lang.as_str(),
                "sh" | "bash" | "shell" | "zsh" | "console" | "shell-session" | "shellsession"
            );
            match directive.take() {
                _ if shell && info != "sh" => panic!(
                    "{name}:{}: a shell block is fenced ```sh (a `<!-- test: skip, REASON -->` \
                     line before it keeps the test from running it)",
                    i + 1
                ),
                Some((at, Run::File(_))) if shell => misplaced(name, at),
                Some((_, Run::File(path))) => blocks.push(Block {
                    line: i + 1,
                    run: Run::File(path),
                    text,
                    shown: Vec::new(),
                }),
                Some((at, _)) if !shell => misplaced(name, at),
                directive if shell => blocks.push(Block {
                    line: i + 1,
                    run: directive.map_or(Run::InOrder, |(_, run)| run),
                    text,
                    shown: Vec::new(),
                }),
                _ if lang == "text" => {
                    let last = blocks
                        .iter_mut()
                        .rev()
                        .find(|b| !matches!(b.run, Run::File(_)))
                        .unwrap_or_else(|| {
                            panic!("{name}:{}: an output block before any command", i + 1)
                        });
                    assert!(
                        last.run != Run::Skip,
                        "{name}:{}: an output block after a command the test does not run",
                        i + 1
                    );
                    last.shown.push(Shown { line: i + 1, text });
                }
                _ => {}
            }
            i = end + 1;
            continue;
        }
        if let Some((at, _)) = directive.as_ref().filter(|_| !line.is_empty()) {
            panic!("{name}:{at}: a directive must come right before its block");
        }
        i += 1;
    }
    if let Some((at, _)) = directive {
        panic!("{name}:{at}: a directive must come right before its block");
    }
    blocks
}

fn misplaced(name: &str, at: usize) -> ! {
    panic!(
        "{name}:{at}: a directive must come right before a block it fits \
         (`file` before a code block that is not ```sh, the others before a ```sh block)"
    )
}

/// Whether `real`, a block's output, is what `shown` shows (the rules are
/// at the top of this file); the error says where they part.
pub fn compare(shown: &str, real: &str) -> Result<(), String> {
    let pattern: Vec<String> = normal_lines(shown);
    let receiver = |l: &String| l.starts_with("receiver: ");
    let mut actual: Vec<String> = normal_lines(&unweave(real));
    if !pattern.iter().any(receiver) {
        actual.retain(|l| !receiver(l));
    }
    if lines_match(&pattern, &actual) {
        return Ok(());
    }
    // the first shown line that cannot be placed, for the message
    let placed = (0..=pattern.len())
        .rev()
        .find(|&n| prefix_matches(&pattern[..n], &actual))
        .unwrap_or(0);
    Err(format!(
        "shown (normalised):\n{}\nprinted (normalised):\n{}\nthe first shown line not printed there: {:?}",
        pattern.join("\n"),
        actual.join("\n"),
        pattern.get(placed).map_or("(the end: more was printed)", |s| s)
    ))
}

/// `text` with each request line of the background receiver that landed in
/// the middle of another process's line moved onto a line of its own.
/// The receiver writes a whole line at once, so such a line runs from
/// `receiver: POST ` to the end of its line, and the line it interrupted
/// goes on at the start of the next.
pub fn unweave(text: &str) -> String {
    const MARK: &str = "receiver: POST ";
    let mut out = String::with_capacity(text.len());
    let mut pending = String::new();
    let mut moved = Vec::new();
    for line in text.split_inclusive('\n') {
        // a line of its own, unless a line before it was interrupted
        match line.find(MARK).filter(|&at| at > 0 || !pending.is_empty()) {
            Some(at) => {
                pending.push_str(&line[..at]);
                moved.push(line[at..].to_string());
            }
            None => {
                out.extend(moved.drain(..));
                out.push_str(&pending);
                pending.clear();
                out.push_str(line);
            }
        }
    }
    out.extend(moved);
    out.push_str(&pending);
    out
}

/// A text's lines with times and ids replaced, spaces made one, blank
/// lines dropped.
pub fn normal_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| {
            normalise(l)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|l| !l.is_empty())
        .collect()
}

/// `pattern` (with `...` lines) matches all of `lines`.
fn lines_match(pattern: &[String], lines: &[String]) -> bool {
    match pattern.split_first() {
        None => lines.is_empty(),
        Some((p, rest)) if p == "..." => (0..=lines.len()).any(|k| lines_match(rest, &lines[k..])),
        Some((p, rest)) => lines
            .split_first()
            .is_some_and(|(l, more)| line_matches(p, l) && lines_match(rest, more)),
    }
}

/// `pattern` matches the start of `lines` (what is left may be anything).
fn prefix_matches(pattern: &[String], lines: &[String]) -> bool {
    let mut open = pattern.to_vec();
    open.push("...".into());
    lines_match(&open, lines)
}

/// One line against a shown line in which `...` stands for any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let pieces: Vec<&str> = pattern.split("...").collect();
    if pieces.len() == 1 {
        return pattern == line;
    }
    let (first, last) = (pieces[0], pieces[pieces.len() - 1]);
    if !line.starts_with(first) || line.len() < first.len() + last.len() || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for piece in &pieces[1..pieces.len() - 1] {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

/// `line` with its times (`2026-12-02 12:38:05.512Z`, `38ms`) and ids (a
/// relay's `host:pid:tag`, a UUID) replaced by placeholders.
pub fn normalise(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !is_word(b[i - 1]);
        let found = if boundary {
            timestamp(b, i)
                .map(|n| (n, "<time>"))
                .or_else(|| uuid(b, i).map(|n| (n, "<uuid>")))
                .or_else(|| relay_id(b, i).map(|n| (n, "<relay>")))
                .or_else(|| duration(b, i).map(|n| (n, "<duration>")))
        } else {
            None
        };
        match found {
            Some((n, placeholder)) => {
                out.push_str(placeholder);
                i += n;
            }
            None => {
                let c = line[i..].chars().next().expect("a char at a char boundary");
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// How many of `b[i..]` match `shape`: `9` a digit, `f` a hex digit,
/// anything else itself.
fn shaped(b: &[u8], i: usize, shape: &str) -> Option<usize> {
    let s = shape.as_bytes();
    let got = b.get(i..i + s.len())?;
    got.iter()
        .zip(s)
        .all(|(c, want)| match want {
            b'9' => c.is_ascii_digit(),
            b'f' => c.is_ascii_hexdigit(),
            _ => c == want,
        })
        .then_some(s.len())
}

fn digits(b: &[u8], i: usize) -> usize {
    b[i.min(b.len())..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count()
}

/// `2026-12-02`, then optionally ` 12:38` or `T12:38`, `:05`, `.512`, and
/// `Z` or an offset.
fn timestamp(b: &[u8], i: usize) -> Option<usize> {
    let mut n = shaped(b, i, "9999-99-99")?;
    if matches!(b.get(i + n), Some(b' ' | b'T')) {
        if let Some(m) = shaped(b, i + n + 1, "99:99") {
            n += 1 + m;
            if let Some(m) = shaped(b, i + n, ":99") {
                n += m;
                if b.get(i + n) == Some(&b'.') && digits(b, i + n + 1) > 0 {
                    n += 1 + digits(b, i + n + 1);
                }
            }
            if b.get(i + n) == Some(&b'Z') {
                n += 1;
            } else if let Some(m) = shaped(b, i + n, "+99:99").or(shaped(b, i + n, "-99:99")) {
                n += m;
            }
        }
    }
    Some(n)
}

fn uuid(b: &[u8], i: usize) -> Option<usize> {
    shaped(b, i, "ffffffff-ffff-ffff-ffff-ffffffffffff")
}

/// A relay's id, `host:pid:tag` (tag four hex digits), ending a word.
fn relay_id(b: &[u8], i: usize) -> Option<usize> {
    let host = b[i..]
        .iter()
        .take_while(|&&c| is_word(c) || c == b'-' || c == b'.')
        .count();
    if host == 0 || b.get(i + host) != Some(&b':') {
        return None;
    }
    let pid = digits(b, i + host + 1);
    if pid == 0 {
        return None;
    }
    let n = host + 1 + pid + shaped(b, i + host + 1 + pid, ":ffff")?;
    (!b.get(i + n).is_some_and(|&c| is_word(c))).then_some(n)
}

/// `38ms`, `1.5s`, `2m`, ...: a number and a unit, ending a word.
fn duration(b: &[u8], i: usize) -> Option<usize> {
    let mut n = digits(b, i);
    if n == 0 {
        return None;
    }
    if b.get(i + n) == Some(&b'.') && digits(b, i + n + 1) > 0 {
        n += 1 + digits(b, i + n + 1);
    }
    let unit = ["ms", "µs", "us", "ns", "s", "m", "h"]
        .iter()
        .find(|u| b[i + n..].starts_with(u.as_bytes()))?;
    n += unit.len();
    (!b.get(i + n).is_some_and(|&c| is_word(c))).then_some(n)
}

#[test]
fn a_page_is_read_into_blocks_with_their_directives_and_shown_output() {
    let page = "# T\n\n<!-- test: skip, it installs -->\n```sh\ncargo install x\n```\n\n\
                ```sh\necho one\necho two\n```\n\n```text\none\ntwo\n```\n\n\
                <!-- test: file app.py -->\n```python\nprint(1)\n```\n\n```text\nlater\n```\n\n\
                <!-- test: after the checks -->\n```sh\nkill $P\n```\n\n\
                <!-- test: at the end -->\n```sh\ndrop\n```\n";
    let read = blocks("t.md", page);
    let got: Vec<(usize, Run, &str, Vec<usize>)> = read
        .iter()
        .map(|b| {
            let shown = b.shown.iter().map(|s| s.line).collect();
            (b.line, b.run.clone(), b.text.as_str(), shown)
        })
        .collect();
    assert_eq!(
        got,
        [
            (4, Run::Skip, "cargo install x", vec![]),
            (8, Run::InOrder, "echo one\necho two", vec![13, 23]),
            (19, Run::File("app.py".into()), "print(1)", vec![]),
            (28, Run::AfterChecks, "kill $P", vec![]),
            (33, Run::AtEnd, "drop", vec![]),
        ]
    );
    for bad in [
        "```bash\necho\n```\n",
        "```sh,ignore\necho\n```\n",
        "<!-- test: skip -->\n```sh\necho\n```\n",
        "<!-- test: later -->\n```sh\necho\n```\n",
        "<!-- test: skip, why -->\n\nsome text\n```sh\necho\n```\n",
        "<!-- test: skip, why -->\n```text\nout\n```\n",
        "<!-- test: file a.sh -->\n```sh\necho\n```\n",
        "```text\nout before any command\n```\n",
        "<!-- test: skip, why -->\n```sh\necho\n```\n```text\nnot run, not checked\n```\n",
    ] {
        let refused = std::panic::catch_unwind(|| blocks("t.md", bad)).is_err();
        assert!(refused, "accepted: {bad:?}");
    }
}

#[test]
fn shown_output_is_compared_but_for_times_ids_spacing_and_elisions() {
    let real = "2026-12-03T19:41:15.123456Z  INFO outbox_relay: retried intent 2\n\
                #  STARTED                   TOOK  OUTCOME\n\
                4  2026-12-03 19:41:15.512Z  6ms   delivered  vm-7:27538:74a6\n\
                \n\
                lease 0b6c5a2e-8e5f-4f43-9c55-2d0e1a7f3b11 took 1.5s\n";
    let shown = "...\n#  STARTED  TOOK  OUTCOME\n\
                 4  2026-12-02 12:38:27.564Z  38ms  delivered  vm:1:e82a\n\
                 lease ... took 2s";
    assert_eq!(compare(shown, real), Ok(()));
    // what is not a time or an id must be equal
    for wrong in [
        "...\n#  STARTED  TOOK  OUTCOME\n4 <time> 6ms dead vm:1:e82a\n...",
        "#  STARTED  TOOK  OUTCOME\n...",
        "...\n#  STARTED  TOOK  OUTCOME",
        "...\nlease ... took 2s\nmore",
    ] {
        assert!(compare(wrong, real).is_err(), "accepted: {wrong:?}");
    }
    // receiver lines of the background receiver may land anywhere
    let real = "receiver: POST /orders webhook-id=msg_1 -> 200\n{\"a\":1}\n";
    assert_eq!(compare("{\"a\":1}", real), Ok(()));
    assert!(compare(
        "receiver: POST /other webhook-id=msg_1 -> 200\n{\"a\":1}",
        real
    )
    .is_err());
    // even in the middle of a command's line, which goes on after it
    let woven = "{\"a\":receiver: POST /o webhook-id=msg_1 -> 200\n1}\nnext\n";
    assert_eq!(
        unweave(woven),
        "receiver: POST /o webhook-id=msg_1 -> 200\n{\"a\":1}\nnext\n"
    );
    assert_eq!(compare("{\"a\":1}\nnext", woven), Ok(()));
    let twice = "{receiver: POST /a -> 200\nreceiver: POST /b -> 200\n}\n";
    assert_eq!(
        unweave(twice),
        "receiver: POST /a -> 200\nreceiver: POST /b -> 200\n{}\n"
    );
    assert_eq!(
        normalise("at 2026-12-02 12:38:05.512Z, id 42, port 48080, ok:1:2, 3 attempts, 0s"),
        "at <time>, id 42, port 48080, ok:1:2, 3 attempts, <duration>"
    );
}
