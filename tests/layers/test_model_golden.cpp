// A whole TransformerLM against PyTorch: same weights, same batch, the loss
// and every parameter gradient (tests/fixtures/make_model_golden.py).
#include <doctest/doctest.h>

#include "golden.h"
#include "tapeformer/layers/transformer.h"

TEST_CASE("golden: a 2-layer GPT's loss and every parameter gradient match PyTorch") {
  const Golden g = load_golden_file(std::string(TAPEFORMER_FIXTURE_DIR) + "/golden_model.txt");
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  Rng rng(0);
  TransformerLM model(c, rng);
  NamedTensors weights;
  for (const auto& [name, p] : model.named_parameters()) weights.emplace_back(name, g.tensor("w." + name));
  model.load_state(weights);  // fails if any name or shape differs from PyTorch's

  Var loss = cross_entropy(model.forward(g.index("ids"), rng), g.index("targets"));
  CHECK(loss.item() == doctest::Approx(g.scalar("loss")).epsilon(1e-6));
  backward(loss);
  for (const auto& [name, p] : model.named_parameters()) check_close(p.grad(), g.tensor("g." + name), "grad " + name);
}
