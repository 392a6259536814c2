    constexpr int KPI = 4;
    constexpr int PER = D / 32;
    const int Hq = q_shape[1];
    const int Lq = q_shape[2];
    const int Hkv = k_shape[1];
    const int C = k_shape[2];
