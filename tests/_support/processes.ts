/**
 * The processes running on this machine whose command line names something (a temporary
 * directory, a store): to tell whether a process tree ended with its parent. Linux only (`/proc`).
 *
 * @module
 */

/** The PIDs of processes whose command line contains `text`. */
export function processesWith(text: string): number[] {
  const pids: number[] = [];
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    try {
      const cmdline = Deno.readTextFileSync(`/proc/${entry.name}/cmdline`).replaceAll("\0", " ");
      if (cmdline.includes(text)) pids.push(Number(entry.name));
    } catch {
      // exited meanwhile
    }
  }
  return pids;
}
