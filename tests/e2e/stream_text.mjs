// stream_text.mjs - the text of one streamed completion as the official
// openai client receives it, printed as a JSON string (for the namespace
// tests, which run it inside a node's namespace).
//   node stream_text.mjs BASE_URL MODEL PROMPT MAX_TOKENS
import OpenAI from 'openai';

const [base, model, prompt, max] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', timeout: 300000, maxRetries: 0 });
let text = '';
try {
  const stream = await client.completions.create({
    model, prompt, max_tokens: Number(max), temperature: 0, stream: true });
  for await (const chunk of stream)
    text += chunk.choices[0]?.text ?? '';
  console.log(JSON.stringify(text));
} catch (e) {
  console.log(JSON.stringify(`error: ${e.message}`));
  process.exitCode = 1;
}
