// Drives the OpenAI Agents SDK against the fake upstream: one agent with a
// function tool, three user turns in one conversation. Each run() is given
// the whole history (the previous result's history plus the new user
// message), with store: false, or true with FAKE_STORE=true, and no
// previous_response_id. See fake.mjs for the environment.
//
//   FAKE_BASE_URL=http://127.0.0.1:PORT/v1 node agents.mjs
import OpenAI from 'openai';
import { Agent, run, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled, tool } from '@openai/agents';
import { instructions, runCommand, runCommandParameters, settings, userTurns } from './fake.mjs';

const { baseURL, apiKey, store } = settings();

// No trace export: the fake upstream is the only thing the SDK may talk to.
setTracingDisabled(true);
setOpenAIAPI('responses');
setDefaultOpenAIClient(
  new OpenAI({
    baseURL,
    apiKey,
    maxRetries: 0,
    timeout: 30_000,
    defaultHeaders: { 'x-session-id': 'agents-1' },
  }),
);

const runCommandTool = tool({
  name: 'run_command',
  description: 'Run a shell command and return its output.',
  parameters: runCommandParameters,
  strict: true,
  async execute(input) {
    const { command } = typeof input === 'string' ? JSON.parse(input) : input;
    return runCommand(command);
  },
});

const agent = new Agent({
  name: 'Shell helper',
  instructions,
  model: 'gpt-5.1',
  tools: [runCommandTool],
  modelSettings: {
    store,
    reasoning: { effort: 'low', summary: 'auto' },
    providerData: { include: ['reasoning.encrypted_content'] },
  },
});

let history = [];
for (const text of userTurns) {
  history.push({ role: 'user', content: text });
  const result = await run(agent, history, { maxTurns: 10 });
  console.log(`[agents] ${result.finalOutput}`);
  history = result.history;
}
console.log(`[agents] ${history.length} history items`);
