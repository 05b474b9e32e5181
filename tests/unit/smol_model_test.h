// Base fixture for unit tests that run the real SmolLM2 model: loaded once per test suite and
// shared by its tests as model_. A missing file fails the test (scripts/fetch-model.sh fetches
// it), or skips it when NT_ALLOW_MISSING_MODEL=1.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/engine.h"

namespace nt::testing_smol {

inline const std::string kSmolPath = NT_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";

// True when the test may skip (rather than fail) because the model file is absent.
inline bool missing_model_allowed() {
    const char* allow = std::getenv("NT_ALLOW_MISSING_MODEL");
    return allow && std::string(allow) == "1";
}

class SmolModelTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        if (std::filesystem::exists(kSmolPath)) model_ = Model::load(kSmolPath).release();
    }
    static void TearDownTestSuite() {
        delete model_;
        model_ = nullptr;
    }
    void SetUp() override {
        if (!model_) {
            if (missing_model_allowed()) GTEST_SKIP() << kSmolPath << " not present";
            FAIL() << kSmolPath << " is missing; run scripts/fetch-model.sh";
        }
    }
    static inline Model* model_ = nullptr;
};

}  // namespace nt::testing_smol
