// Drives the OpenAI Agents SDK against the fake upstream: one agent with a
// function tool, three user turns in one conversation. Each run() is given
// the whole history (the previous result's history plus the new user
// message), with store: false and no previous_response_id.
//
//   FAKE_BASE_URL=http://127.0.0.1:PORT/v1 node agents.mjs
import OpenAI from 'openai';
import { Agent, run, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled, tool } from '@openai/agents';

const baseURL = process.env.FAKE_BASE_URL;
if (!baseURL) {
  console.error('FAKE_BASE_URL is not set');
  process.exit(2);
}

// No trace export: the fake upstream is the only thing the SDK may talk to.
setTracingDisabled(true);
setOpenAIAPI('responses');
setDefaultOpenAIClient(
  new OpenAI({
    baseURL,
    apiKey: process.env.FAKE_API_KEY || 'fake-key',
    maxRetries: 0,
    timeout: 30_000,
    defaultHeaders: { 'x-session-id': 'agents-1' },
  }),
);

const runCommand = tool({
  name: 'run_command',
  description: 'Run a shell command and return its output.',
  parameters: {
    type: 'object',
    properties: { command: { type: 'string', description: 'The command line to run.' } },
    required: ['command'],
    additionalProperties: false,
  },
  strict: true,
  async execute(input) {
    const { command } = typeof input === 'string' ? JSON.parse(input) : input;
    const outputs = { 'echo hello': 'hello', ls: 'README.md\npackage.json', pwd: '/work' };
    return `$ ${command}\n${outputs[command] ?? ''}`;
  },
});

const agent = new Agent({
  name: 'Shell helper',
  instructions: 'You are a terse assistant. Use run_command to inspect the machine before answering.',
  model: 'gpt-5.1',
  tools: [runCommand],
  modelSettings: {
    store: false,
    reasoning: { effort: 'low', summary: 'auto' },
    providerData: { include: ['reasoning.encrypted_content'] },
  },
});

const userTurns = [
  'What directory am I in?',
  'Now list the files there.',
  'Thanks. Summarise what you found in one line.',
];

let history = [];
for (const text of userTurns) {
  history.push({ role: 'user', content: text });
  const result = await run(agent, history, { maxTurns: 10 });
  console.log(`[agents] ${result.finalOutput}`);
  history = result.history;
}
console.log(`[agents] ${history.length} history items`);
