// Drives opencode against the fake upstream: one session of three user
// turns, `opencode run` then `opencode run --continue` twice, in a
// throwaway home and work directory. The provider is a custom one on the
// @ai-sdk/openai package opencode bundles, configured by an opencode.json
// in the work directory (project config):
//
//   {"model": "fake/gpt-5.1", "provider": {"fake": {"npm": "@ai-sdk/openai",
//    "options": {"baseURL": FAKE_BASE_URL, "apiKey": "{env:FAKE_API_KEY}"}, …}}}
//
// opencode sends store: false, the whole history each time (assistant
// messages as {"role":"assistant","content":[{"type":"output_text",…}]}),
// an x-session-id header and a prompt_cache_key naming its session, and a
// title-generation call under the same session id before the first turn.
// See fake.mjs for the environment (FAKE_STORE is not read: opencode
// decides). The binary is that of a package pinned in package.json's
// optionalDependencies, see opencodeBinary.
//
//   FAKE_BASE_URL=http://127.0.0.1:PORT/v1 node opencode.mjs [ROOT]
//
// ROOT is the directory to work in (made if missing, kept); without it a
// temporary one, removed at the end. opencode's home is ROOT/home, its
// temporary directory ROOT/tmp and its work directory ROOT/work. Each run
// is bounded by FAKE_OPENCODE_TIMEOUT seconds (default 120); its output is
// checked for the fake model's answer, printed as "[opencode] text".
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { settings } from './fake.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));

/** The user messages of the session: run, then run --continue for each further one. */
const prompts = [
  'Show me where we are and what is here.',
  'Run the same checks again, please.',
  'One more time, then tell me you are done.',
];

const { baseURL, apiKey } = settings();
const timeoutSeconds = Number(process.env.FAKE_OPENCODE_TIMEOUT || 120);
if (!(timeoutSeconds > 0)) {
  console.error(`FAKE_OPENCODE_TIMEOUT is ${JSON.stringify(process.env.FAKE_OPENCODE_TIMEOUT)}, want seconds`);
  process.exit(2);
}
const opencode = opencodeBinary();

/**
 * Returns the path of the opencode binary of the package pinned in
 * package.json's optionalDependencies: opencode-linux-x64, or on a CPU
 * without AVX2 opencode-linux-x64-baseline, the first that runs (as the
 * opencode-ai package picks its binary). Exits with status 2 when none does.
 */
function opencodeBinary() {
  let avx2 = false;
  try {
    avx2 = /(^|\s)avx2(\s|$)/i.test(fs.readFileSync('/proc/cpuinfo', 'utf8'));
  } catch {
    // not Linux: no binary below runs
  }
  const packages = avx2
    ? ['opencode-linux-x64', 'opencode-linux-x64-baseline']
    : ['opencode-linux-x64-baseline', 'opencode-linux-x64'];
  for (const name of packages) {
    const bin = path.join(here, 'node_modules', name, 'bin', 'opencode');
    if (!fs.existsSync(bin)) continue;
    const res = spawnSync(bin, ['--version'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 60_000 });
    if (res.status === 0) return bin;
  }
  console.error(`no opencode binary of ${packages.join(' or ')} runs here (npm ci in ${here} installs them, on Linux x64)`);
  process.exit(2);
}

const temporary = !process.argv[2];
const root = temporary ? fs.mkdtempSync(path.join(os.tmpdir(), 'opencode-')) : path.resolve(process.argv[2]);
const home = path.join(root, 'home');
const tmp = path.join(root, 'tmp');
const work = path.join(root, 'work');
for (const dir of [home, tmp, work]) fs.mkdirSync(dir, { recursive: true });

const config = {
  model: 'fake/gpt-5.1',
  small_model: 'fake/gpt-5.1',
  autoupdate: false,
  share: 'disabled',
  // No edit tools; the shell runs without asking.
  permission: { edit: 'deny', bash: 'allow', webfetch: 'allow', external_directory: 'allow' },
  provider: {
    fake: {
      npm: '@ai-sdk/openai',
      name: 'Fake upstream',
      options: { baseURL, apiKey: '{env:FAKE_API_KEY}' },
      models: { 'gpt-5.1': { name: 'gpt-5.1', reasoning: true, tool_call: true } },
    },
  },
};
fs.writeFileSync(path.join(work, 'opencode.json'), JSON.stringify(config, null, 2) + '\n');

// The environment: none of the caller's OpenAI settings, everything
// opencode keeps under root, nothing fetched but from the upstream.
const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('OPENAI_')));
Object.assign(env, {
  // opencode takes its directory from PWD, not from the working directory.
  PWD: work,
  HOME: home,
  XDG_CONFIG_HOME: path.join(home, '.config'),
  XDG_DATA_HOME: path.join(home, '.local', 'share'),
  XDG_CACHE_HOME: path.join(home, '.cache'),
  XDG_STATE_HOME: path.join(home, '.local', 'state'),
  TMPDIR: tmp,
  FAKE_API_KEY: apiKey,
  OPENCODE_DISABLE_AUTOUPDATE: '1',
  OPENCODE_DISABLE_DEFAULT_PLUGINS: '1',
  OPENCODE_DISABLE_MODELS_FETCH: '1',
  OPENCODE_DISABLE_LSP_DOWNLOAD: '1',
});

try {
  for (const [i, prompt] of prompts.entries()) {
    const args = i === 0 ? ['run', prompt] : ['run', '--continue', prompt];
    const res = spawnSync(opencode, args, {
      cwd: work,
      env,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: timeoutSeconds * 1000,
      killSignal: 'SIGKILL',
      maxBuffer: 64 << 20,
    });
    const what = `opencode ${args.slice(0, -1).join(' ')} (user turn ${i + 1})`;
    if (res.error || res.status !== 0) {
      const why = res.error ? res.error.message : `exit status ${res.status ?? res.signal}`;
      throw new Error(`${what}: ${why}\n${res.stdout.slice(-4000)}\n${res.stderr.slice(-4000)}`);
    }
    const answer = res.stdout.split('\n').find((line) => line.startsWith('Done with message'));
    if (!answer) {
      throw new Error(`${what}: no answer of the fake model in its output:\n${res.stdout.slice(-4000)}\n${res.stderr.slice(-4000)}`);
    }
    console.log(`[opencode] ${answer}`);
  }
} finally {
  if (temporary) fs.rmSync(root, { recursive: true, force: true });
}
