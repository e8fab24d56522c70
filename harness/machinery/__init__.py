"""What reload paths drive beside the engine: the live trainer (``trainer``), the weight
transfer and its sources (``transfer``), where Ray places engines and trainers
(``placement``) and requests kept generating across a refit (``in_flight``). Engine-side
code (vLLM, torch, Ray): the arm and the paths import it; it imports neither of them."""
