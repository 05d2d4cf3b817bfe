// Settings and fixtures shared by the drivers of the fake upstream
// (jssdk.mjs, agents.mjs, aisdk.mjs, opencode.mjs). The environment:
//
//   FAKE_BASE_URL  the upstream, http://127.0.0.1:PORT/v1 (required)
//   FAKE_API_KEY   the API key to send (default fake-key)
//   FAKE_STORE     "true" to send store: true (default: store: false)

/** Reads the environment; exits with status 2 when FAKE_BASE_URL is unset. */
export function settings() {
  const baseURL = process.env.FAKE_BASE_URL;
  if (!baseURL) {
    console.error('FAKE_BASE_URL is not set');
    process.exit(2);
  }
  const store = process.env.FAKE_STORE ?? 'false';
  if (store !== 'true' && store !== 'false') {
    console.error(`FAKE_STORE is ${JSON.stringify(store)}, want true or false`);
    process.exit(2);
  }
  return { baseURL, apiKey: process.env.FAKE_API_KEY || 'fake-key', store: store === 'true' };
}

export const instructions = 'You are a terse assistant. Use run_command to inspect the machine before answering.';

/** The user messages of the one conversation each driver holds. */
export const userTurns = [
  'What directory am I in?',
  'Now list the files there.',
  'Thanks. Summarise what you found in one line.',
];

/** The JSON schema of run_command's arguments. */
export const runCommandParameters = {
  type: 'object',
  properties: { command: { type: 'string', description: 'The command line to run.' } },
  required: ['command'],
  additionalProperties: false,
};

/** Pretends to run a command the model asked for and returns its output. */
export function runCommand(command) {
  const outputs = { 'echo hello': 'hello', ls: 'README.md\npackage.json', pwd: '/work' };
  return `$ ${command}\n${outputs[command] ?? ''}`;
}
