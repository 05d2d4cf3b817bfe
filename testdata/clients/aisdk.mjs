// Drives the Vercel AI SDK (ai with @ai-sdk/openai, openai.responses())
// against the fake upstream: one conversation of three user turns, each a
// tool loop of generateText or streamText with the run_command tool. The
// SDK sends the whole history each time, never previous_response_id: with
// store as shipped (the request has no store member, so the upstream keeps
// the responses) earlier reasoning items and assistant messages go back as
// {"type":"item_reference","id":…}; with store: false they go back whole,
// with their encrypted reasoning, and assistant messages in the short form
// {"role":"assistant","content":"text"}. See fake.mjs for the environment;
// FAKE_STORE is not read here, the second argument says what to send.
//
//   FAKE_BASE_URL=http://127.0.0.1:PORT/v1 node aisdk.mjs generate|stream [shipped|nostore]
//
// generate  generateText(), history gets result.responseMessages
// stream    streamText(), the text streamed, then history gets
//           await result.responseMessages
// shipped   store as the SDK ships it, not sent (the default)
// nostore   providerOptions: {openai: {store: false}}
//
// FAKE_SESSION_ID, when set, is sent as a session-id header. Each answer is
// printed as a line "[aisdk-MODE] text".
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, jsonSchema, stepCountIs, streamText, tool } from 'ai';
import { instructions, runCommand, runCommandParameters, settings, userTurns } from './fake.mjs';

const modes = ['generate', 'stream'];
const stores = ['shipped', 'nostore'];
const [mode, storeMode = 'shipped'] = process.argv.slice(2);
if (!modes.includes(mode) || !stores.includes(storeMode)) {
  console.error(`usage: node aisdk.mjs ${modes.join('|')} [${stores.join('|')}]`);
  process.exit(2);
}
const { baseURL, apiKey } = settings();
const label = `[aisdk-${mode}]`;

const openai = createOpenAI({ baseURL, apiKey });
const model = openai.responses('gpt-5.1');

const tools = {
  run_command: tool({
    description: 'Run a shell command and return its output.',
    inputSchema: jsonSchema(runCommandParameters),
    async execute({ command }) {
      return runCommand(command);
    },
  }),
};

const openaiOptions = { reasoningEffort: 'low', reasoningSummary: 'auto' };
if (storeMode === 'nostore') openaiOptions.store = false;

const headers = {};
if (process.env.FAKE_SESSION_ID) headers['session-id'] = process.env.FAKE_SESSION_ID;

// turn runs one user message's tool loop over the history and returns the
// answer's text and the messages to append.
async function turn(messages) {
  const options = {
    model,
    instructions,
    messages,
    tools,
    headers,
    maxRetries: 0,
    stopWhen: stepCountIs(10),
    providerOptions: { openai: openaiOptions },
    abortSignal: AbortSignal.timeout(60_000),
  };
  if (mode === 'generate') {
    const result = await generateText(options);
    return { text: result.text, messages: result.responseMessages };
  }
  let failure;
  const result = streamText({
    ...options,
    onError({ error }) {
      failure ??= error;
    },
  });
  let text = '';
  for await (const delta of result.textStream) text += delta;
  if (failure) throw failure;
  return { text: await result.text, messages: await result.responseMessages };
}

const history = [];
for (const content of userTurns) {
  history.push({ role: 'user', content });
  const { text, messages } = await turn(history);
  if (!text) throw new Error('the tool loop ended without an answer');
  console.log(`${label} ${text}`);
  history.push(...messages);
}
console.log(`${label} ${history.length} history messages`);
