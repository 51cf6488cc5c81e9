/**
 * The parts of a markdown file that the documentation tests check — headings (as GitHub's anchors),
 * links and fenced code blocks — and a link checker over a set of files. Fenced code is skipped when
 * looking for headings and links: a `# comment` in a shell block is not a heading.
 */
import { dirname, join, normalize, relative } from "node:path";

/** A fenced code block: its info string (`ts ignore`), its text and the line of its fence. */
export interface CodeBlock {
  readonly info: string;
  readonly code: string;
  readonly line: number;
}

/** A link's target as written (`../cli.md#exit-codes`) and the line it is on. */
export interface Link {
  readonly target: string;
  readonly line: number;
}

/** A markdown file, split into what the tests look at. */
export interface Markdown {
  /** The anchors of its headings, as GitHub makes them (duplicates numbered). */
  readonly anchors: ReadonlySet<string>;
  readonly links: readonly Link[];
  readonly blocks: readonly CodeBlock[];
  /** The text with every fenced block blanked out (line numbers kept). */
  readonly prose: string;
}

const FENCE = /^\s*(`{3,}|~{3,})(.*)$/;

/**
 * GitHub's anchor of a heading (github-slugger's rule on the heading's rendered text): lower case,
 * every character that is not a letter, digit, mark, space, `-` or `_` dropped, each space a `-`.
 */
export function githubSlug(heading: string): string {
  const text = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1") // a link renders as its text
    .replace(/[`*]/g, "");
  return text.toLowerCase().replace(/[^\p{L}\p{N}\p{M}\p{Pc} -]/gu, "").replace(/ /g, "-");
}

/** Splits `text` into its headings' anchors, its links and its fenced code blocks. */
export function parseMarkdown(text: string): Markdown {
  const lines = text.split("\n");
  const blocks: CodeBlock[] = [];
  const prose: string[] = [];
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (let i = 0; i < lines.length; i++) {
    const open = FENCE.exec(lines[i]);
    if (open === null) {
      prose.push(lines[i]);
      const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(lines[i]);
      if (heading !== null) {
        const slug = githubSlug(heading[1]);
        const n = seen.get(slug) ?? 0;
        seen.set(slug, n + 1);
        anchors.add(n === 0 ? slug : `${slug}-${n}`);
      }
      continue;
    }
    const start = i;
    const body: string[] = [];
    prose.push("");
    for (i++; i < lines.length && !lines[i].trim().startsWith(open[1]); i++) {
      body.push(lines[i]);
      prose.push("");
    }
    prose.push("");
    blocks.push({ info: open[2].trim(), code: body.join("\n"), line: start + 1 });
  }
  const blanked = prose.join("\n");
  // Code spans are not links; blank them keeping their length so that line numbers hold.
  const plain = blanked.replace(/`[^`\n]*`/g, (span) => " ".repeat(span.length));
  const links: Link[] = [];
  for (const m of plain.matchAll(/\]\(\s*([^)\s]+)(?:\s+"[^"]*")?\s*\)/g)) {
    links.push({ target: m[1], line: plain.slice(0, m.index).split("\n").length });
  }
  return { anchors, links, blocks, prose: blanked };
}

/** One link that does not resolve: where it is and why. */
export interface BrokenLink {
  readonly file: string;
  readonly line: number;
  readonly target: string;
  readonly problem: string;
}

/**
 * Every relative link of `files` (paths relative to `root`) that does not resolve: a file that does
 * not exist (or lies outside `root`), or an `#anchor` that no heading of the target makes. Links
 * with a scheme (`https:`, `mailto:`) are not followed.
 */
export async function brokenLinks(root: string, files: readonly string[]): Promise<BrokenLink[]> {
  const parsed = new Map<string, Markdown>();
  const read = async (file: string) => {
    let doc = parsed.get(file);
    if (doc === undefined) {
      doc = parseMarkdown(await Deno.readTextFile(join(root, file)));
      parsed.set(file, doc);
    }
    return doc;
  };
  const broken: BrokenLink[] = [];
  for (const file of files) {
    for (const { target, line } of (await read(file)).links) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith("//")) continue;
      const [path, anchor] = target.split("#", 2) as [string, string | undefined];
      const resolved = path === "" ? file : normalize(join(dirname(file), decodeURI(path)));
      const report = (problem: string) => broken.push({ file, line, target, problem });
      if (relative(root, join(root, resolved)).startsWith("..")) {
        report("outside the repository");
        continue;
      }
      const stat = await Deno.stat(join(root, resolved)).catch(() => undefined);
      if (stat === undefined) {
        report(`no such file: ${resolved}`);
      } else if (anchor !== undefined) {
        if (!resolved.endsWith(".md")) report(`an anchor into ${resolved}, which has no headings`);
        else if (!(await read(resolved)).anchors.has(anchor)) {
          report(`no heading of ${resolved} makes #${anchor}`);
        }
      }
    }
  }
  return broken;
}

/** The markdown files under `dir` (relative to `root`), sorted. */
export async function markdownFiles(root: string, dir: string): Promise<string[]> {
  const found: string[] = [];
  for await (const entry of Deno.readDir(join(root, dir))) {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory) found.push(...await markdownFiles(root, path));
    else if (entry.isFile && entry.name.endsWith(".md")) found.push(path);
  }
  return found.sort();
}
