// A small Markdown renderer for model output: paragraphs, headings, emphasis, inline code,
// fenced code blocks (with a copy button), lists, block quotes, rules and links. It never
// parses HTML: every piece of text becomes a text node (textContent), so markup in the
// model's text shows as text and can never run. Links keep only http: and https: targets.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*))?$/;
const BLANK = /^\s*$/;

function el(tag, className) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  return e;
}

export function safeHref(url) {
  try {
    const u = new URL(url);
    return u.protocol === 'http:' || u.protocol === 'https:' ? u.href : null;
  } catch {
    return null;
  }
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

// Inline syntax, earliest match first: escapes, code spans, links, autolinks, bold,
// strikethrough, italics.
const INLINE = new RegExp([
  String.raw`\\([\\\x60*_{}\[\]()#+\-.!~>|])`,                      // 1: escaped character
  String.raw`(\x60+)([^\x60]|[^\x60][\s\S]*?[^\x60])\2(?!\x60)`,    // 2, 3: code span
  String.raw`\[([^\]\n]*)\]\(\s*<?([^\s()<>]+)>?(?:\s+"[^"\n]*")?\s*\)`, // 4, 5: link
  String.raw`<(https?:\/\/[^>\s]+)>`,                               // 6: autolink
  String.raw`(https?:\/\/[^\s<>"\x60]*[^\s<>"\x60.,:;!?'")\]])`,    // 7: bare URL
  String.raw`\*\*(?=\S)([\s\S]*?\S)\*\*`,                           // 8: bold
  String.raw`(?<![A-Za-z0-9])__(?=\S)([\s\S]*?\S)__(?![A-Za-z0-9])`, // 9: bold
  String.raw`~~(?=\S)([\s\S]*?\S)~~`,                               // 10: strikethrough
  String.raw`\*(?=[^\s*])([^*]*?[^\s*])\*(?!\*)`,                   // 11: italic
  String.raw`(?<![A-Za-z0-9_])_(?=[^\s_])([^_]*?[^\s_])_(?![A-Za-z0-9_])`, // 12: italic
].join('|'), 'g');

export function appendInline(parent, text) {
  const re = new RegExp(INLINE.source, 'g');
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.append(document.createTextNode(text.slice(last, m.index)));
    last = re.lastIndex;
    if (m[1] !== undefined) {
      parent.append(document.createTextNode(m[1]));
    } else if (m[2] !== undefined) {
      const code = el('code');
      code.textContent = m[3].length > 2 && m[3].startsWith(' ') && m[3].endsWith(' ') ? m[3].slice(1, -1) : m[3];
      parent.append(code);
    } else if (m[4] !== undefined) {
      const href = safeHref(m[5]);
      if (href) {
        const a = link(href);
        appendInline(a, m[4] || m[5]);
        parent.append(a);
      } else {
        appendInline(parent, m[4]);  // not http(s): the text only
      }
    } else if (m[6] !== undefined || m[7] !== undefined) {
      const url = m[6] ?? m[7];
      const href = safeHref(url);
      if (href) {
        const a = link(href);
        a.textContent = url;
        parent.append(a);
      } else {
        parent.append(document.createTextNode(m[0]));
      }
    } else {
      const inner = m[8] ?? m[9] ?? m[10] ?? m[11] ?? m[12];
      const tag = m[8] !== undefined || m[9] !== undefined ? 'strong' : m[10] !== undefined ? 'del' : 'em';
      const e = el(tag);
      appendInline(e, inner);
      parent.append(e);
    }
  }
  if (last < text.length) parent.append(document.createTextNode(text.slice(last)));
}

function link(href) {
  const a = el('a');
  a.href = href;
  a.target = '_blank';
  a.rel = 'noopener noreferrer nofollow';
  return a;
}

// Lines of a paragraph or list item, single line breaks kept.
function appendLines(parent, lines) {
  lines.forEach((line, k) => {
    if (k) parent.append(el('br'));
    appendInline(parent, line);
  });
}

export function codeBlock(code, lang) {
  const box = el('div', 'code');
  const head = el('div', 'code-head');
  const label = el('span');
  label.textContent = lang || 'code';
  const copy = el('button', 'copy');
  copy.type = 'button';
  copy.textContent = 'Copy';
  copy.addEventListener('click', () => copyText(code, copy));
  head.append(label, copy);
  const pre = el('pre');
  const c = el('code');
  if (lang) c.dataset.lang = lang;
  c.textContent = code;
  pre.append(c);
  box.append(head, pre);
  return box;
}

async function copyText(text, button) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch { /* no clipboard permission: say so below */ }
  button.textContent = ok ? 'Copied' : 'Copy failed';
  button.dataset.copied = ok ? '1' : '0';
  setTimeout(() => { button.textContent = 'Copy'; }, 1500);
}

// A list starting at lines[i] (a list item); returns the index after it.
function parseList(lines, i, parent) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = el(ordered ? 'ol' : 'ul');
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const li = el('li');
    const text = [m[3] ?? ''];
    ++i;
    for (;;) {
      if (i >= lines.length) break;
      const line = lines[i];
      if (BLANK.test(line)) {
        // A blank line continues the list only when another item (or indented text) follows.
        let j = i + 1;
        while (j < lines.length && BLANK.test(lines[j])) ++j;
        const next = j < lines.length ? ITEM.exec(lines[j]) : null;
        const indentedText = j < lines.length && !next && /^\s+/.exec(lines[j])?.[0].length > indent;
        if ((next && next[1].length >= indent) || indentedText) { i = j; continue; }
        break;
      }
      const sub = ITEM.exec(line);
      if (sub && sub[1].length > indent) {
        appendLines(li, text.splice(0));
        i = parseList(lines, i, li);
        continue;
      }
      if (sub || (startsBlock(line) && !/^\s{4,}/.test(line))) break;
      text.push(line.trim());
      ++i;
    }
    if (text.length) {
      const holder = el('span');
      appendLines(holder, text);
      li.prepend(...holder.childNodes);
    }
    list.append(li);
  }
  parent.append(list);
  return i;
}

// Markdown text to a DocumentFragment. An unclosed code fence (a streaming answer) runs to
// the end of the text.
export function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  renderBlocks(frag, String(text).replace(/\r\n?/g, '\n').split('\n'), 0);
  return frag;
}

function renderBlocks(parent, lines, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const close = new RegExp(`^ {0,3}${fence[0] === '`' ? '`' : '~'}{${fence.length},}\\s*$`);
      const body = [];
      for (++i; i < lines.length && !close.test(lines[i]); ++i) body.push(lines[i]);
      ++i;
      parent.append(codeBlock(body.join('\n'), m[2]));
    } else if (BLANK.test(line)) {
      ++i;
    } else if ((m = HEADING.exec(line))) {
      const h = el(`h${m[1].length}`);
      appendInline(h, m[2]);
      parent.append(h);
      ++i;
    } else if (RULE.test(line)) {
      parent.append(el('hr'));
      ++i;
    } else if (QUOTE.test(line) && depth < 8) {
      const inner = [];
      for (; i < lines.length && (m = QUOTE.exec(lines[i])); ++i) inner.push(m[1]);
      const q = el('blockquote');
      renderBlocks(q, inner, depth + 1);
      parent.append(q);
    } else if (ITEM.test(line) && ITEM.exec(line)[3] !== undefined) {
      i = parseList(lines, i, parent);
    } else {
      const para = [];
      for (; i < lines.length && !BLANK.test(lines[i]) && !(para.length && startsBlock(lines[i])); ++i)
        para.push(lines[i].trim());
      if (!para.length) para.push(lines[i++].trim());  // a lone list marker and the like
      const p = el('p');
      appendLines(p, para);
      parent.append(p);
    }
  }
}
