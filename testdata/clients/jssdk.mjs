// Drives the OpenAI JS SDK against the fake upstream: one conversation of
// three user turns, each a tool loop, every request carrying the full
// history with store: false, or true with FAKE_STORE=true (never
// previous_response_id). See fake.mjs for the environment.
//
//   FAKE_BASE_URL=http://127.0.0.1:PORT/v1 node jssdk.mjs create-stream|create|stream-helper
//
// create-stream  responses.create({stream: true}), history gets the items of
//                the response.output_item.done events
// create         responses.create(), history gets response.output
// stream-helper  responses.stream() then finalResponse(), history gets its
//                output as the helper returns it
import OpenAI from 'openai';
import { instructions, runCommand, runCommandParameters, settings, userTurns } from './fake.mjs';

const patterns = ['create-stream', 'create', 'stream-helper'];
const pattern = process.argv[2];
if (!patterns.includes(pattern)) {
  console.error(`usage: node jssdk.mjs ${patterns.join('|')}`);
  process.exit(2);
}
const { baseURL, apiKey, store } = settings();

const client = new OpenAI({
  baseURL,
  apiKey,
  maxRetries: 0,
  timeout: 30_000,
  defaultHeaders: { 'x-session-id': `jssdk-${pattern}` },
});

const params = {
  model: 'gpt-5.1',
  instructions,
  tools: [
    {
      type: 'function',
      name: 'run_command',
      description: 'Run a shell command and return its output.',
      parameters: runCommandParameters,
      strict: true,
    },
  ],
  store,
  include: ['reasoning.encrypted_content'],
  reasoning: { effort: 'low', summary: 'auto' },
};

// respond sends the whole history and returns the output items to append.
async function respond(input) {
  switch (pattern) {
    case 'create-stream': {
      const stream = await client.responses.create({ ...params, input, stream: true });
      const items = [];
      for await (const event of stream) {
        if (event.type === 'response.output_item.done') items.push(event.item);
        if (event.type === 'response.failed' || event.type === 'error') {
          throw new Error(`stream failed: ${JSON.stringify(event)}`);
        }
      }
      return items;
    }
    case 'create': {
      const response = await client.responses.create({ ...params, input });
      return response.output;
    }
    case 'stream-helper': {
      const stream = client.responses.stream({ ...params, input });
      for await (const _event of stream) {
        // events are only drained; the final response is what is kept
      }
      const response = await stream.finalResponse();
      return response.output;
    }
  }
}

const history = [];
let requests = 0;
for (const text of userTurns) {
  history.push({ role: 'user', content: text });
  for (let step = 0; ; step++) {
    if (step === 10) throw new Error('the tool loop did not end');
    const items = await respond(history);
    requests++;
    history.push(...items);
    const calls = items.filter((item) => item.type === 'function_call');
    if (calls.length === 0) {
      const message = items.find((item) => item.type === 'message');
      if (!message) throw new Error(`no message in ${JSON.stringify(items)}`);
      console.log(`[${pattern}] ${message.content.map((part) => part.text).join('')}`);
      break;
    }
    for (const call of calls) {
      const { command } = JSON.parse(call.arguments);
      history.push({ type: 'function_call_output', call_id: call.call_id, output: runCommand(command) });
    }
  }
}
console.log(`[${pattern}] ${requests} requests, ${history.length} history items`);
